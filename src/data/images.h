// Image folders as datasets: `data: {name: images, path: ROOT, size: 32x32}`.
//
// The layout is the ImageFolder convention torchvision uses:
//
//   ROOT/<class>/<file>.png | .jpg | .jpeg     (extension case ignored; other files skipped)
//
// The class of an image is the position of its folder's name among the class folders sorted
// by name (byte order), so "cat" is 0 and "dog" 1 whatever order the file system lists them in;
// files within a class are taken in sorted order too, so example numbers are the same on every
// machine. A test folder (data.test_path) uses the training folder's class list: its class
// folders must all be training classes (some may be missing).
//
// Every image becomes float32 [C, H, W]: decoded (data/image_codec.h), converted to C channels
// (C = the first training image's, grey 1 or RGB 3, unless ImageOptions::channels says), resized
// to H x W (bilinear), scaled to [0, 1] and normalised per channel, (v - mean[c]) / std[c].
//
// Augmentation (training only, ImageOptions::random_crop / random_flip) is applied per batch,
// after the batch is drawn, by augment_images(): the random numbers of example i in epoch e come
// from a generator seeded by (train.seed, e, i) alone (data/rng.h), so a run is deterministic and
// the same example gets the same crop whichever worker draws it and however many there are.
//
// Failure, InvalidArgument naming the path: a missing ROOT or one that is not a directory; no
// class folder in it; a class folder without images; an image that cannot be decoded (unless
// skip_bad); a test class that is not a training class; bad options (size, mean/std lengths).
// Thread safety: all functions are safe to call concurrently; load_images uses its own threads.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "data/dataset.h"

namespace krab::data {

// What load_images needs besides the root (the data.* keys of the same names).
struct ImageOptions {
  int64_t height = 0, width = 0;  // data.size; >= 1
  int64_t channels = 0;           // 1 or 3; 0 = the first training image's
  std::vector<double> mean{0.0};  // one value for every channel, or one per channel
  std::vector<double> std{1.0};   // likewise; every value > 0
  int64_t random_crop = 0;        // padding of the random crop; 0 = no crop
  bool random_flip = false;       // horizontal flip with probability 1/2
  int64_t threads = 2;            // decoding threads (data.decode_threads), >= 1
  bool skip_bad = false;          // skip unreadable images (counted) instead of failing
  std::string test_path;          // "" = no test split
};

// The files of one image folder and their labels, in example order.
struct ImageFolder {
  std::string root;
  std::vector<std::string> classes;  // sorted class folder names; label i is classes[i]
  std::vector<std::string> files;    // paths, class by class, each class's files sorted
  std::vector<int64_t> labels;       // parallel to files
};

// Lists ROOT's class folders and images. With `classes` empty the class list is ROOT's own
// folders; otherwise (a test split) every folder of ROOT must be one of `classes` and takes its
// label from there. InvalidArgument as in the header comment (no decoding is done here).
ImageFolder scan_image_folder(const std::string& root,
                              const std::vector<std::string>& classes = {});

// Parses data.size: "H,W", "HxW", "[H, W]" or one number N for N x N. InvalidArgument naming
// data.size otherwise.
std::pair<int64_t, int64_t> parse_image_size(const std::string& text);

// Parses data.mean / data.std: one number, or numbers separated by commas (brackets allowed).
// InvalidArgument naming `key` otherwise.
std::vector<double> parse_number_list(const std::string& text, const std::string& key);

// Decoded examples of a folder and how many were skipped (skip_bad).
struct DecodedImages {
  TensorDataset data;  // inputs [N, C, H, W] normalised, targets int64 [N]
  int64_t skipped = 0;
  std::string first_skipped;  // the first skipped file's error, "" when none
};

// Decodes every image of `folder` on options.threads threads into memory, with `channels`
// (1 or 3). Without skip_bad the first unreadable image (in example order) fails the load.
DecodedImages decode_image_folder(const ImageFolder& folder, const ImageOptions& options,
                                  int64_t channels);

// The training folder at `root` (and options.test_path's, when set) decoded into memory.
// input_shape is {C, H, W}; num_classes the number of training class folders. `skipped`, when
// not null, receives the number of images skip_bad left out of both splits.
DataSplits load_images(const std::string& root, const ImageOptions& options,
                       int64_t* skipped = nullptr);

// Applies random_crop / random_flip in place to `x` [n, C, H, W], whose row r is example
// idx[r], drawn in epoch `epoch` of a run seeded with `seed`. A crop pads the image with
// `random_crop` zeros (the mean, after normalisation) on every side and cuts an H x W window at
// a uniformly drawn offset; a flip mirrors left to right. No-op without either option.
void augment_images(at::Tensor& x, const std::vector<int64_t>& idx, uint64_t seed, int64_t epoch,
                    const ImageOptions& options);

}  // namespace krab::data

// Image folders as datasets: `data: {name: images, path: ROOT, size: 32x32}`.
//
// The layout is the ImageFolder convention torchvision uses:
//
//   ROOT/<class>/[<sub-folder>/...]<file>.png | .jpg | .jpeg   (extension case ignored; other
//                                                               files skipped)
//
// The class of an image is the position of its class folder's name among the class folders
// sorted by name (byte order), so "cat" is 0 and "dog" 1 whatever order the file system lists
// them in. Images in sub-folders of a class folder belong to it, at any depth up to
// kMaxImageFolderDepth (as in ImageFolder); a class's images are taken in byte order of their
// path below the class folder, so example numbers are the same on every machine. Names starting
// with '.' are skipped at every level. Symbolic links are followed, but each folder is read once:
// a link back to a parent, or a second link to a folder already read, is refused. A test folder
// (data.test_path) uses the training folder's class list: its class folders must all be training
// classes (some may be missing).
//
// Listing only names: every entry with an image's extension that is not a folder is listed,
// whatever it is, and whether it can be read is decided by reading it (image_codec.h: a symbolic
// link to nothing, a FIFO or a file without read permission is unreadable like a damaged file).
// So one rule covers every unreadable image: the job stops naming it, or data.skip_bad skips it.
//
// Every image becomes float32 [C, H, W]: decoded (data/image_codec.h), converted to C channels
// (C = the first training image's, grey 1 or RGB 3, unless ImageOptions::channels says), resized
// to H x W (bilinear), scaled to [0, 1] and normalised per channel, (v - mean[c]) / std[c].
//
// Two ways to hold the training split (ImageOptions::lazy):
//   in memory  every image decoded at load, on options.threads threads (DataSplits::train);
//   lazy       only listed at load, each file's header checked (probe_image_file); the pixels
//              are decoded when a batch asks for them (ImageFolderDataset in lazy_train), on
//              the prefetcher's threads (prefetch_image_batches), so a folder larger than
//              memory trains. Decoded images may be kept in a bounded LRU cache (cache_mb).
// Both give the same tensors bit for bit. The test split (options.test_path) likewise: decoded
// at load, or (lazy) header-checked at load and decoded at each evaluation, a batch at a time on
// options.threads threads, without a cache (DataSplits::lazy_test), so that a test set larger
// than memory evaluates too.
//
// Augmentation (training only, ImageOptions::random_crop / random_flip) is applied per batch,
// after the batch is drawn, by augment_images(): the random numbers of example i in epoch e come
// from a generator seeded by (train.seed, e, i) alone (data/rng.h), so a run is deterministic and
// the same example gets the same crop whichever worker draws it and however many there are.
//
// Failure, InvalidArgument naming the path: a missing ROOT or one that is not a directory; no
// class folder in it; a class folder without images; a folder that cannot be listed, that is
// deeper than kMaxImageFolderDepth below its class folder, or that was read already (a link); an
// image that cannot be decoded, or (lazy) whose header check fails (an image stating more than
// max_pixels pixels among them: refused before its pixels are allocated), unless skip_bad; a test
// class that is not a training class; bad options (size, mean/std lengths). Lazily, a file that
// passes the header check but fails to decode (damaged pixel data) is found by the batch that first
// holds it: ImageFolderDataset::get throws naming it, or with skip_bad replaces it by the next
// readable example (see there). Thread safety: all functions are safe to call concurrently;
// load_images uses its own threads.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "data/dataset.h"
#include "data/image_codec.h"
#include "data/prefetch.h"
#include "data/sampler.h"

namespace krab::data {

// How many folders below its class folder images are looked for: a bound on the recursion of a
// walk that already reads each folder once (so a symbolic-link loop is refused, not followed).
// Real layouts nest one to three levels (a class split by date, source or camera).
inline constexpr int kMaxImageFolderDepth = 16;

// What load_images needs besides the root (the data.* keys of the same names).
struct ImageOptions {
  int64_t height = 0, width = 0;           // data.size; >= 1
  int64_t channels = 0;                    // 1 or 3; 0 = the first training image's
  std::vector<double> mean{0.0};           // one value for every channel, or one per channel
  std::vector<double> std{1.0};            // likewise; every value > 0
  int64_t random_crop = 0;                 // padding of the random crop; 0 = no crop
  bool random_flip = false;                // horizontal flip with probability 1/2
  int64_t threads = 2;                     // decoding threads (data.decode_threads), >= 1
  bool skip_bad = false;                   // skip unreadable images (counted) instead of failing
  int64_t max_pixels = kDefaultMaxPixels;  // data.max_pixels: larger images are unreadable
  std::string test_path;                   // "" = no test split
  bool lazy = false;                       // decode the training split per batch, not at load
  int64_t cache_mb = 0;  // lazy: MiB of decoded training images kept (LRU); 0 = none
  // Lazy with skip_bad: told, once per file, of an image found unreadable while training and
  // what replaces it (one line, no prefix). Null: not told.
  std::function<void(const std::string&)> note;
};

// The files of one image folder and their labels, in example order.
struct ImageFolder {
  std::string root;
  std::vector<std::string> classes;  // sorted class folder names; label i is classes[i]
  std::vector<std::string> files;    // paths, class by class, each class's files sorted
  std::vector<int64_t> labels;       // parallel to files
};

// Lists ROOT's class folders and the images below each (sub-folders included). With `classes`
// empty the class list is ROOT's own folders; otherwise (a test split) every folder of ROOT must
// be one of `classes` and takes its label from there. InvalidArgument as in the header comment
// (nothing is opened or decoded here: an unreadable image is listed, and found when read).
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

// The training split of an image folder read lazily: example i is folder.files[i], decoded,
// converted, resized and normalised when get() asks for it (exactly decode_image_folder's
// numbers), then kept in an LRU cache of at most options.cache_mb MiB. Memory does not grow
// with the number of images beyond the list of names. get() is thread-safe; the files are read
// outside the lock, so several threads decode at once.
//
// An image that fails to decode: without skip_bad get() throws InvalidArgument naming it (the
// message says data.skip_bad); with skip_bad the example is replaced, now and in every later
// batch, by the next example in order (cyclically) that decodes, with that example's label, and
// options.note is told once. The replacement depends only on which files are unreadable, so it
// is the same on every worker and for any number of threads.
class ImageFolderDataset final : public Dataset {
 public:
  // InvalidArgument for bad options (size, threads, mean / std for `channels`). get() decodes
  // the examples of one call on `get_threads` threads: 1 for a training split, whose batches
  // the prefetcher's threads already make side by side; options.threads for a test split,
  // which evaluation reads from the training thread.
  ImageFolderDataset(ImageFolder folder, ImageOptions options, int64_t channels,
                     int64_t get_threads = 1);

  int64_t size() const override { return static_cast<int64_t>(folder_.files.size()); }
  std::pair<at::Tensor, at::Tensor> get(const std::vector<int64_t>& idx) const override;
  // The cache's bound (all the images when they fit in it): what it may hold.
  int64_t resident_bytes() const override;

  const ImageFolder& folder() const { return folder_; }
  // Every example's label, int64 [N] (as listed: a replaced example's own).
  at::Tensor targets() const;
  // Files get() has found unreadable and replaced so far (skip_bad).
  int64_t replaced() const;
  // Bytes of decoded images in the cache now.
  int64_t cached_bytes() const;

 private:
  // Example i as the model sees it (the replacement's when i is unreadable) and its label.
  std::pair<at::Tensor, int64_t> example(int64_t i) const;
  // Example i from the cache or its file; undefined with `error` set when it cannot be read.
  at::Tensor load(int64_t i, std::string& error) const;
  int64_t replacement(int64_t bad, const std::string& error) const;

  ImageFolder folder_;
  ImageOptions options_;
  int64_t channels_;
  int64_t get_threads_;
  std::vector<float> mean_, std_;
  int64_t entry_bytes_ = 0, capacity_ = 0;  // bytes of one decoded image; cache size in images

  mutable std::mutex mu_;
  mutable std::list<int64_t> recent_;  // cached examples, most recently used first
  mutable std::unordered_map<int64_t, std::pair<at::Tensor, std::list<int64_t>::iterator>> cache_;
  mutable std::map<int64_t, int64_t> replaced_;  // unreadable example -> the one used instead
};

// The training folder at `root` (and options.test_path's, when set). Both splits are decoded
// into memory (DataSplits::train, test), or with options.lazy listed and header-checked only
// (ImageFolderDatasets in DataSplits::lazy_train, lazy_test; the test one keeps no cache).
// input_shape is {C, H, W}; num_classes the number of training class folders. `skipped`, when
// not null, receives the number of images skip_bad left out of both splits at load.
DataSplits load_images(const std::string& root, const ImageOptions& options,
                       int64_t* skipped = nullptr);

// The batches of `train` for the steps of `sampler` below `end_step`, made ahead on
// options.threads background threads, 2 x threads batches at most: train.get (which decodes,
// for an ImageFolderDataset) then augment_images with `seed` and the step's epoch. A batch is a
// function of (step, slice) alone, so the number of threads changes no number.
std::unique_ptr<BatchPrefetcher> prefetch_image_batches(std::shared_ptr<const Dataset> train,
                                                        const GlobalBatchSampler& sampler,
                                                        const ImageOptions& options, uint64_t seed,
                                                        int64_t end_step);

// Applies random_crop / random_flip in place to `x` [n, C, H, W], whose row r is example
// idx[r], drawn in epoch `epoch` of a run seeded with `seed`. A crop pads the image with
// `random_crop` zeros (the mean, after normalisation) on every side and cuts an H x W window at
// a uniformly drawn offset; a flip mirrors left to right. No-op without either option.
void augment_images(at::Tensor& x, const std::vector<int64_t>& idx, uint64_t seed, int64_t epoch,
                    const ImageOptions& options);

}  // namespace krab::data

// Reading one file written by Python's torch.save({"x": X, "y": Y}, FILE), without Python.
//
// Since torch 1.6, torch.save writes a zip archive (stored, not compressed):
//
//   NAME/data.pkl      a pickle of the saved object; each tensor is a call to
//                      torch._utils._rebuild_tensor_v2 naming its storage by key, with its
//                      dtype, storage offset, sizes and strides
//   NAME/data/KEY      the raw bytes of storage KEY (views of one tensor share one storage)
//   NAME/version
//
// LibTorch's Unpickler reads data.pkl and asks a callback for each storage's bytes. That
// callback is what lets a reader look at a file without reading its examples: it can hand back
// an empty placeholder instead of the bytes, which yields tensors whose sizes and dtypes are
// right but whose data must never be touched. inspect_tensor_file() uses this to read only the
// header (data.pkl, a few hundred bytes) and, when asked, the labels' storage; this is how a
// directory of shards is indexed without reading its examples. The older non-zip format
// (torch.save(..., _use_new_zipfile_serialization=False)) is not read.
//
// Stateless and thread-safe: every call opens the file itself.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace krab::data {

// What a tensor file holds, as its header says.
struct TensorFileInfo {
  int64_t examples = 0;          // N, the first dimension of x and of y
  std::vector<int64_t> x_shape;  // x's shape without N
  std::vector<int64_t> y_shape;  // y's shape without N
  at::ScalarType x_dtype = at::kFloat;
  at::ScalarType y_dtype = at::kLong;  // as saved (read_tensor_file widens integers to int64)
  int64_t bytes = 0;                   // bytes of x and y once read (int64 y counted as such)
  at::Tensor labels;                   // y's values (contiguous) when asked for; else undefined
};

// True for the y dtypes read as classes (integers and bool); floating dtypes are targets.
bool integer_targets(at::ScalarType y_dtype);

// The header of the file at `path`, and with `with_labels` y's values too; x's bytes are not
// read. Throws as read_tensor_file does, except that it does not see a truncated x storage.
TensorFileInfo inspect_tensor_file(const std::string& path, bool with_labels);

// The whole file: {x, y} on the CPU (whatever device they were saved from), with integer y
// widened to int64 and each tensor compact (a view of a larger storage is copied out of it, so
// that bytes held = bytes counted).
// InvalidArgument naming `path`: a missing file; not a torch.save zip archive; Python objects
// other than tensors, numbers, strings, lists and dicts (a NumPy array, an instance of a user's
// class); an object that is not a dict with tensors "x" and "y"; x or y without a first
// dimension; x and y of different lengths ("x has 100 examples but y has 99"); a complex or
// otherwise unsupported y dtype; a sparse or quantized x or y. CorruptData naming `path`: an
// archive that LibTorch cannot read (truncated, damaged); a zip directory or pickle that states
// sizes, lengths or memo indices its bytes do not back, or whose opcodes take stack items that
// are not there (checked before LibTorch's reader, which believes them, sees the file); a
// tensor reaching past its storage, or a storage past its record; a tensor that states more
// elements than its storage holds (a view with a zero or overlapping stride, x.expand(...)),
// which would be copied out in full: refused before anything the size of a tensor is allocated,
// so that what a file makes krab allocate is bounded by the file's own size (at most 8 x, for
// one-byte labels widened to int64).
TensorDataset read_tensor_file(const std::string& path);

}  // namespace krab::data

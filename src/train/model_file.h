// TorchSaveWriter: model.pt — a name -> tensor dict in torch.save's zip format — written as
// a stream, one tensor at a time (docs/design/zero-sharding.md §4.4). torch::pickle_save builds
// the whole file in memory (twice the model's bytes at its peak); this writer holds one
// tensor's bytes and the dict's pickle (a few hundred bytes per entry), so rank 0 of a
// sharded run and `krab export` never need the whole model at once.
//
// The file is what Python's torch.save(dict) writes and what torch.load and
// torch::pickle_load read: a zip (caffe2's PyTorchStreamWriter, streaming to a ByteSink) of
//   archive/data/K   the bytes of tensor K (one storage per tensor, row-major)
//   archive/data.pkl a pickle (protocol 2) of a plain dict: name ->
//                    torch._utils._rebuild_tensor_v2(persistent_load(('storage', torch.XStorage,
//                    'K', 'cpu', numel)), 0, sizes, strides, False, OrderedDict())
//   archive/version  "3\n"
// The outer container must be a plain dict (EMPTY_DICT), not collections.OrderedDict:
// LibTorch's unpickler turns every OrderedDict into None (design §12, check 11).
//
// Errors of the sink (a full disk) come out of add() / finish() as the sink threw them; a writer
// destroyed unfinished writes nothing more (the caller's AtomicFileWriter then drops the file).
// Names are written in the order add() is called; a name twice is the caller's bug (Error).
// Dtypes: float32/64/16, bfloat16, int64/32/16/8, uint8, bool; NotSupported for others. One
// thread; finish() once, after which nothing more may be added.
#pragma once

#include <ATen/core/Tensor.h>

#include <exception>
#include <memory>
#include <set>
#include <string>

#include "core/byte_sink.h"

namespace caffe2::serialize {
class PyTorchStreamWriter;
}

namespace krab::train {

class TorchSaveWriter {
 public:
  explicit TorchSaveWriter(core::ByteSink& out);
  ~TorchSaveWriter();
  TorchSaveWriter(const TorchSaveWriter&) = delete;
  TorchSaveWriter& operator=(const TorchSaveWriter&) = delete;

  // Writes the tensor's bytes now (a contiguous CPU copy only if it is not one already).
  void add(const std::string& name, const at::Tensor& tensor);
  // Writes the dict and the end of the archive.
  void finish();

 private:
  // Runs a call into the zip writer; a sink failure it reported as its own error is rethrown
  // as the sink's.
  template <typename F>
  void guarded(F&& f);

  std::exception_ptr failure_;  // what the sink threw
  bool discard_ = false;        // after a failure or when destroyed unfinished
  std::unique_ptr<caffe2::serialize::PyTorchStreamWriter> zip_;
  std::string pickle_;  // the dict's entries so far
  std::set<std::string> names_;
  int64_t next_key_ = 0;
};

}  // namespace krab::train

// Loading a TorchScript file without reading its tensors' bytes, so that ZeRO stage 3 can shard
// a scripted model as it loads it (docs/design/zero-sharding.md §3.4, §12 check 14).
//
// torch::jit::load reads every tensor of the module's state (the archive's records data/0,
// data/1, ...) into memory it allocates for it: W ranks loading one file hold W whole models at
// once. LibTorch 1.13 has no partial load, but it reads the archive through a
// caffe2::serialize::ReadAdapterInterface the caller may supply, and its zip reader reads a
// stored record with one read of exactly the record's bytes, straight into the storage it has
// just allocated for the tensor (PyTorchStreamReader::getRecord). DeferredTensorReads is such a
// reader that skips those reads: the storage is allocated but never written. An allocation of
// 1 MiB or more is a fresh mapping under the threshold the stage-3 workers fix
// (train/engines.cpp), whose pages take no memory until written; so a loaded module's
// parameters cost almost nothing until they are read. The reader remembers, for each skipped
// read, the file range it was for; fill(t) reads tensor t's storage from the file later, on
// demand.
//
// What is deferred: the stored records under data/ (the tensors of the module object: its
// parameters, buffers and tensor attributes); never the pickles, the code or constants/ (the
// tensors inside the code). A deferred storage holds indeterminate bytes until filled: the
// caller fills every tensor it does not overwrite itself (TorchScriptModel fills all but the
// trainable parameters at once, and those unit by unit: torchscript.h).
//
// Use: construct over the file, torch::jit::load through it (models/script_inspection.h), then
// keep_reachable(module) once, then fill() as needed. After keep_reachable the reader holds a
// reference to every storage still deferred, so a storage is never freed (and its address
// reused) while the reader believes it unread; fill() drops that reference.
//
// Thread safety: one thread at a time (LibTorch's reader serialises its reads).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>
#include <caffe2/serialize/read_adapter_interface.h>

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

namespace torch::jit {
struct Module;
}

namespace krab::models {

class DeferredTensorReads : public caffe2::serialize::ReadAdapterInterface {
 public:
  // Opens `path` and plans which reads to skip from its zip directory. CorruptData naming
  // `source` for a damaged archive (core::check_zip_directory), InvalidArgument naming it for a
  // file that cannot be read or is not an archive.
  DeferredTensorReads(const std::string& path, const std::string& source);
  ~DeferredTensorReads() override;
  DeferredTensorReads(const DeferredTensorReads&) = delete;
  DeferredTensorReads& operator=(const DeferredTensorReads&) = delete;

  // ReadAdapterInterface, for torch::jit::load: the file's bytes, except that a read of exactly
  // a deferred record's bytes writes nothing (and says it read them all).
  size_t size() const override { return size_; }
  size_t read(uint64_t pos, void* buf, size_t n, const char* what = "") const override;

  // After the load: keeps, as deferred, the storages of the tensors reachable from `module`'s
  // object whose bytes were skipped, each with a reference. Once. False when some skipped
  // buffer is not such a storage (the load copied or dropped it, so a tensor may hold
  // unread bytes that fill() cannot reach): then nothing is kept, and the caller must load the
  // file again without this reader.
  bool keep_reachable(const torch::jit::Module& module);

  // Reads t's storage from the file when it is deferred (then it is not any more); no-op
  // otherwise. CorruptData naming the file on a short read (the file shrank).
  void fill(const at::Tensor& t);
  // Fills every storage still deferred; all but those of the tensors in `keep`.
  void fill_all();
  void fill_all_except(const std::vector<at::Tensor>& keep);
  bool deferred(const at::Tensor& t) const;
  // Bytes of the storages still deferred; bytes filled so far.
  int64_t deferred_bytes() const;
  int64_t filled_bytes() const { return filled_bytes_; }

 private:
  struct Range {
    uint64_t pos = 0;
    size_t bytes = 0;
  };
  struct Deferred {
    c10::Storage storage;
    Range range;
  };
  void read_range(const Range& r, void* into) const;

  std::string path_;
  int fd_ = -1;
  size_t size_ = 0;
  std::map<uint64_t, size_t> planned_;  // data offset -> bytes, of every deferrable record
  // Filled by read() during the load: the buffer each skipped read was for.
  mutable std::unordered_map<const void*, Range> skipped_;
  std::unordered_map<const c10::StorageImpl*, Deferred> deferred_;
  int64_t filled_bytes_ = 0;
};

}  // namespace krab::models

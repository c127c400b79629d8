#include "models/script_deferred.h"

#include <caffe2/serialize/inline_container.h>
#include <fcntl.h>
#include <torch/script.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>

#include "core/archive_walk.h"
#include "core/errors.h"

namespace krab::models {
namespace {

// The cap models/script_inspection.cpp puts on a deflated record (its code).
constexpr uint64_t kMaxInflated = uint64_t{64} << 20;

bool is_state_tensor_record(const std::string& name) {
  if (name.rfind("data/", 0) != 0 || name.size() == 5) return false;
  return name.find_first_not_of("0123456789", 5) == std::string::npos;
}

}  // namespace

DeferredTensorReads::DeferredTensorReads(const std::string& path, const std::string& source)
    : path_(path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  KRAB_CHECK_ARG(in, source, ": cannot read the file");
  size_ = static_cast<size_t>(in.tellg());
  in.seekg(0);
  std::set<std::string> stored;
  const core::ArchiveRecords records =
      core::check_zip_directory(in, size_, source, "TorchScript archive", kMaxInflated, &stored);
  in.clear();
  in.seekg(0);
  // The data offset of a record is past its local header, whose extra field only the reader
  // reads; LibTorch's own reader says where (and checks the archive as it opens it).
  try {
    caffe2::serialize::PyTorchStreamReader reader(&in);
    for (const auto& [name, bytes] : records)
      if (bytes > 0 && stored.count(name) && is_state_tensor_record(name))
        planned_[reader.getRecordOffset(name)] = static_cast<size_t>(bytes);
  } catch (const c10::Error& e) {
    throw InvalidArgument(
        str_cat(source, " is not a TorchScript module: ", e.what_without_backtrace()));
  }
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  KRAB_CHECK_ARG(fd_ >= 0, source, ": cannot read the file (", std::strerror(errno), ")");
}

DeferredTensorReads::~DeferredTensorReads() {
  if (fd_ >= 0) ::close(fd_);
}

void DeferredTensorReads::read_range(const Range& r, void* into) const {
  auto* out = static_cast<char*>(into);
  for (size_t done = 0; done < r.bytes;) {
    const ssize_t got = ::pread(fd_, out + done, r.bytes - done, static_cast<off_t>(r.pos + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      throw CorruptData(str_cat("model.path: '", path_, "': ", r.bytes, " bytes at offset ", r.pos,
                                " could not be read (",
                                got < 0 ? std::strerror(errno) : "the file is shorter", ")"));
    done += static_cast<size_t>(got);
  }
}

size_t DeferredTensorReads::read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const {
  const auto it = planned_.find(pos);
  if (it != planned_.end() && it->second == n) {
    skipped_[buf] = Range{pos, n};
    return n;
  }
  // LibTorch's reader treats a short count as damage and says so, naming what it read.
  size_t done = 0;
  while (done < n) {
    const ssize_t got =
        ::pread(fd_, static_cast<char*>(buf) + done, n - done, static_cast<off_t>(pos + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    done += static_cast<size_t>(got);
  }
  return done;
}

bool DeferredTensorReads::keep_reachable(const torch::jit::Module& module) {
  // A skipped buffer is the data of the storage the reader allocated for the record; the
  // storages the module's object still reaches are the ones to keep. Comparing sizes too
  // guards against an address a freed storage left and a kept one took.
  c10::IValue(module._ivalue()).visit([&](const c10::IValue& v) {
    if (!v.isTensor()) return false;
    const at::Tensor& t = v.toTensor();
    if (!t.defined() || !t.has_storage()) return false;
    const c10::Storage& s = t.storage();
    const auto it = skipped_.find(s.data());
    if (it != skipped_.end() && it->second.bytes == s.nbytes())
      deferred_.emplace(s.unsafeGetStorageImpl(), Deferred{s, it->second});
    return false;
  });
  const bool all = deferred_.size() == skipped_.size();
  skipped_.clear();
  if (!all) deferred_.clear();
  return all;
}

void DeferredTensorReads::fill(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return;
  const auto it = deferred_.find(t.storage().unsafeGetStorageImpl());
  if (it == deferred_.end()) return;
  read_range(it->second.range, it->second.storage.data());
  filled_bytes_ += static_cast<int64_t>(it->second.range.bytes);
  deferred_.erase(it);
}

void DeferredTensorReads::fill_all() { fill_all_except({}); }

void DeferredTensorReads::fill_all_except(const std::vector<at::Tensor>& keep) {
  std::set<const c10::StorageImpl*> kept;
  for (const at::Tensor& t : keep)
    if (t.defined() && t.has_storage()) kept.insert(t.storage().unsafeGetStorageImpl());
  for (auto it = deferred_.begin(); it != deferred_.end();) {
    if (kept.count(it->first)) {
      ++it;
      continue;
    }
    read_range(it->second.range, it->second.storage.data());
    filled_bytes_ += static_cast<int64_t>(it->second.range.bytes);
    it = deferred_.erase(it);
  }
}

bool DeferredTensorReads::deferred(const at::Tensor& t) const {
  return t.defined() && t.has_storage() && deferred_.count(t.storage().unsafeGetStorageImpl());
}

int64_t DeferredTensorReads::deferred_bytes() const {
  int64_t total = 0;
  for (const auto& [impl, d] : deferred_) total += static_cast<int64_t>(d.range.bytes);
  return total;
}

}  // namespace krab::models

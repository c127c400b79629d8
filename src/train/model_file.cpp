#include "train/model_file.h"

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>

#include <cstring>

#include "core/errors.h"

namespace krab::train {
namespace {

// Pickle protocol 2 opcodes this writer uses.
constexpr char kProto = '\x80', kEmptyDict = '}', kMark = '(', kBinUnicode = 'X', kGlobal = 'c',
               kTuple = 't', kEmptyTuple = ')', kBinPersId = 'Q', kBinInt = 'J', kLong1 = '\x8a',
               kNewFalse = '\x89', kReduce = 'R', kSetItems = 'u', kStop = '.';

void text(std::string& out, const std::string& s) {
  out += kBinUnicode;
  const auto n = static_cast<uint32_t>(s.size());
  out.append(reinterpret_cast<const char*>(&n), 4);
  out += s;
}

void integer(std::string& out, int64_t v) {
  if (v >= 0 && v <= INT32_MAX) {
    const auto i = static_cast<int32_t>(v);
    out += kBinInt;
    out.append(reinterpret_cast<const char*>(&i), 4);
  } else {  // LONG1 with 8 bytes: the only LONG1 LibTorch's unpickler reads
    out += kLong1;
    out += '\x08';
    out.append(reinterpret_cast<const char*>(&v), 8);
  }
}

void global(std::string& out, const char* module, const char* name) {
  out += kGlobal;
  out += module;
  out += '\n';
  out += name;
  out += '\n';
}

void int_tuple(std::string& out, at::IntArrayRef values) {
  if (values.empty()) {
    out += kEmptyTuple;
    return;
  }
  out += kMark;
  for (const int64_t v : values) integer(out, v);
  out += kTuple;
}

const char* storage_class(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "FloatStorage";
    case at::kDouble:
      return "DoubleStorage";
    case at::kHalf:
      return "HalfStorage";
    case at::kBFloat16:
      return "BFloat16Storage";
    case at::kLong:
      return "LongStorage";
    case at::kInt:
      return "IntStorage";
    case at::kShort:
      return "ShortStorage";
    case at::kChar:
      return "CharStorage";
    case at::kByte:
      return "ByteStorage";
    case at::kBool:
      return "BoolStorage";
    default:
      return nullptr;
  }
}

}  // namespace

// The zip writer calls back from its C core (miniz): an exception must not cross it. A failure
// is kept and everything from then on dropped, but the zip writer is told the bytes went out:
// told of a short write, it would record an error that its destructor (which writes the end of
// the archive when finish() never ran) throws, and a throwing destructor terminates. guarded()
// rethrows the kept failure after the call.
TorchSaveWriter::TorchSaveWriter(core::ByteSink& out)
    : zip_(std::make_unique<caffe2::serialize::PyTorchStreamWriter>(
          [this, &out](const void* data, size_t n) -> size_t {
            if (discard_) return n;
            try {
              out.write(static_cast<const char*>(data), n);
              return n;
            } catch (...) {
              failure_ = std::current_exception();
              discard_ = true;
              return n;
            }
          })) {}

// Unfinished, the zip writer's destructor would write the end of the archive: into nothing.
TorchSaveWriter::~TorchSaveWriter() {
  discard_ = true;
  zip_.reset();
}

template <typename F>
void TorchSaveWriter::guarded(F&& f) {
  try {
    f();
  } catch (const c10::Error&) {
    if (failure_) std::rethrow_exception(failure_);
    throw;
  }
  if (failure_) std::rethrow_exception(failure_);
}

void TorchSaveWriter::add(const std::string& name, const at::Tensor& tensor) {
  KRAB_CHECK(names_.insert(name).second, "model.pt entry '", name, "' written twice");
  const char* storage = storage_class(tensor.scalar_type());
  if (storage == nullptr)
    throw NotSupported(str_cat("model.pt: '", name, "' is a ", tensor.scalar_type(),
                               " tensor, which this writer does not store"));
  const at::Tensor t = tensor.detach().to(at::kCPU).contiguous();
  const std::string key = std::to_string(next_key_++);
  guarded([&] { zip_->writeRecord("data/" + key, t.data_ptr(), static_cast<size_t>(t.nbytes())); });
  // name: _rebuild_tensor_v2(storage, 0, sizes, strides, False, OrderedDict())
  text(pickle_, name);
  global(pickle_, "torch._utils", "_rebuild_tensor_v2");
  pickle_ += kMark;
  pickle_ += kMark;
  text(pickle_, "storage");
  global(pickle_, "torch", storage);
  text(pickle_, key);
  text(pickle_, "cpu");
  integer(pickle_, t.numel());
  pickle_ += kTuple;
  pickle_ += kBinPersId;
  integer(pickle_, 0);
  int_tuple(pickle_, t.sizes());
  int_tuple(pickle_, t.strides());
  pickle_ += kNewFalse;
  global(pickle_, "collections", "OrderedDict");  // backward hooks: harmless inside (check 11)
  pickle_ += kEmptyTuple;
  pickle_ += kReduce;
  pickle_ += kTuple;
  pickle_ += kReduce;
}

void TorchSaveWriter::finish() {
  std::string pkl;
  pkl += kProto;
  pkl += '\x02';
  pkl += kEmptyDict;
  if (!names_.empty()) {
    pkl += kMark;
    pkl += pickle_;
    pkl += kSetItems;
  }
  pkl += kStop;
  guarded([&] {
    zip_->writeRecord("data.pkl", pkl.data(), pkl.size());
    zip_->writeEndOfFile();
  });
}

}  // namespace krab::train

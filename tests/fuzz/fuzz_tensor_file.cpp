// Fuzzes the tensor-file reader (data/tensor_file.h): inspect_tensor_file, without and with
// labels, then read_tensor_file, on one file.
//
// A torch.save file is a zip archive whose records carry CRC-32s, so random changes to the
// pickle inside almost never get past the archive; the first byte picks a mode. Odd: the rest
// is the whole file. Even: the rest is data.pkl, put into a valid archive (written by LibTorch's
// own writer) beside storages "0" to "3" of 64 bytes each, as a forger would. What the reader
// accepts must be what it promised: x and y of one length, compact, as the header described.
#include <caffe2/serialize/inline_container.h>

#include "data/tensor_file.h"
#include "fuzz/fuzz_util.h"

namespace {

std::string archive_around(const uint8_t* pickle, size_t n) {
  std::string out;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* p, size_t len) {
    out.append(static_cast<const char*>(p), len);
    return len;
  });
  writer.writeRecord("data.pkl", pickle, n);
  std::string storage(64, '\0');
  for (size_t i = 0; i < storage.size(); ++i) storage[i] = static_cast<char>(i % 7);
  for (const char* key : {"0", "1", "2", "3"})
    writer.writeRecord(std::string("data/") + key, storage.data(), storage.size());
  writer.writeEndOfFile();
  return out;
}

void check_read(const std::string& path) {
  using krab::fuzz::check;
  const krab::data::TensorFileInfo header = krab::data::inspect_tensor_file(path, false);
  const krab::data::TensorFileInfo labelled = krab::data::inspect_tensor_file(path, true);
  check(labelled.labels.defined() && labelled.labels.size(0) == header.examples,
        "inspect_tensor_file's labels disagree with its header");
  const krab::data::TensorDataset d = krab::data::read_tensor_file(path);
  check(d.inputs.size(0) == header.examples && d.targets.size(0) == header.examples,
        "read_tensor_file's lengths disagree with the header");
  check(d.inputs.is_contiguous() && d.inputs.storage().nbytes() == d.inputs.nbytes(),
        "read_tensor_file returned x not compact");
  check(d.inputs.scalar_type() == header.x_dtype, "x's dtype differs from the header's");
  const int64_t y_item = krab::data::integer_targets(header.y_dtype) ? 8 : d.targets.element_size();
  check(static_cast<int64_t>(d.inputs.nbytes()) + d.targets.numel() * y_item == header.bytes,
        "the bytes read differ from the header's count");
  if (krab::data::integer_targets(header.y_dtype))  // floats may hold NaN, unequal to itself
    check(labelled.labels.to(at::kLong).equal(d.targets),
          "inspect_tensor_file's labels differ from read_tensor_file's y");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string bytes = (data[0] & 1)
                                ? std::string(reinterpret_cast<const char*>(data) + 1, size - 1)
                                : archive_around(data + 1, size - 1);
  const std::string path = krab::fuzz::write_scratch(
      "tensors.pt", reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  krab::fuzz::refusals_only([&] { check_read(path); });
  return 0;
}

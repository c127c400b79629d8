// Fuzzes checkpoint loading, decode_checkpoint(bytes, ...), into a small model and optimizer.
//
// A random header almost never passes the CRC-32, which would leave the record (core/record.h)
// behind it unexplored; so the first byte picks a mode. Odd: the rest is the whole file, header and
// all. Even: the rest is the payload, and a valid header (magic, version 2, length, CRC) is put
// in front of it, as a writer with a bug (or a forger) would. Either way the only acceptable
// outcomes are a loaded checkpoint or a krab::Error naming the file. No byte reaches a LibTorch
// parser, so this target runs without -fork: any crash is a finding.
#include <torch/torch.h>
#include <zlib.h>

#include "fuzz/fuzz_util.h"
#include "train/checkpoint.h"

namespace {

std::string with_header(const uint8_t* payload, size_t n) {
  std::string out("KRABCKPT", 8);
  const uint32_t version = 2;
  const uint64_t length = n;
  const uint32_t crc =
      static_cast<uint32_t>(crc32(crc32(0L, Z_NULL, 0), payload, static_cast<uInt>(n)));
  out.append(reinterpret_cast<const char*>(&version), 4);
  out.append(reinterpret_cast<const char*>(&length), 8);
  out.append(reinterpret_cast<const char*>(&crc), 4);
  out.append(reinterpret_cast<const char*>(payload), n);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static torch::nn::Linear model(torch::nn::LinearOptions(3, 2));
  static torch::optim::SGD optimizer(model->parameters(),
                                     torch::optim::SGDOptions(0.1).momentum(0.9));
  static const krab::train::CheckpointMeta expect = [] {
    krab::train::CheckpointMeta m;
    m.model_name = "linear";
    m.signature = krab::train::model_signature(*model);
    m.global_batch = 8;
    return m;
  }();
  const std::string bytes = (data[0] & 1)
                                ? std::string(reinterpret_cast<const char*>(data) + 1, size - 1)
                                : with_header(data + 1, size - 1);
  krab::fuzz::refusals_only(
      [&] { krab::train::decode_checkpoint(bytes, "state.krab", expect, *model, optimizer); });
  return 0;
}

// Fuzzes elastic::decode, the reader of a generation record (elastic/generation.h): text that
// arrives through the job's store, where any holder of the job secret can write. A record it
// accepts must be canonical — encode() gives back exactly the input bytes — so two workers can
// never read one store value as two different memberships; and its ranks run 0..W-1.
#include <string>
#include <string_view>

#include "elastic/generation.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  krab::fuzz::refusals_only([&] {
    const auto record = krab::elastic::decode(text);
    krab::fuzz::check(krab::elastic::encode(record) == text,
                      "an accepted record does not encode back to its own bytes");
    for (int r = 0; r < record.workers(); ++r)
      krab::fuzz::check(record.members[r].rank == r, "an accepted record's ranks are not 0..W-1");
  });
  return 0;
}

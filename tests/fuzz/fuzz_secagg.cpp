// Fuzzes the secure-aggregation wire formats (secagg.h, shamir.h): the first byte picks the
// message type, the rest is its bytes.
//
// Every format is canonical, so a message that parses must serialise back to exactly the bytes
// it came from. A message the server receives is then handed to a server waiting at that step
// of a run of three honest clients (a copy of it, made once per process), and the round is
// finished where the message allows: the server must refuse a bad message with a krab::Error
// and stay usable, never crash.
#include <map>
#include <optional>

#include "federated/secagg.h"
#include "fuzz/fuzz_util.h"

namespace {

using namespace krab::federated::secagg;

// Servers waiting at each step of one honest run, and the honest messages of the last step.
struct Snapshots {
  std::optional<Server> advertise, share_keys, masked_input, unmask;
  std::vector<UnmaskResponse> responses;

  Snapshots() {
    Config cfg;
    cfg.round = 42;
    cfg.vector_length = 4;
    cfg.threshold = 2;
    cfg.clients = 3;
    cfg.fp = FixedPoint::for_clients(1.0, 3);
    std::map<uint64_t, Client> clients;
    for (uint64_t id : {3, 10, 17}) clients.emplace(id, Client(id, cfg));
    Server s(cfg);
    advertise = s;
    for (auto& [id, c] : clients) s.receive(c.advertise_keys());
    const Roster roster = s.roster();
    share_keys = s;
    for (auto& [id, c] : clients) s.receive(c.share_keys(roster));
    std::map<uint64_t, IncomingShares> incoming;
    for (auto& [id, c] : clients) incoming[id] = s.shares_for(id);
    masked_input = s;
    for (auto& [id, c] : clients)
      s.receive(c.masked_input(incoming[id], std::vector<float>{0.5f, -0.25f, 0.f, 1.f}));
    const UnmaskRequest request = s.unmask_request();
    unmask = s;
    for (auto& [id, c] : clients) responses.push_back(c.unmask(request));
  }
};

// Parses, checks the round trip, and returns the message.
template <typename M>
M parse(const uint8_t* data, size_t size) {
  M m = M::from_bytes(data, size);
  krab::fuzz::check(m.to_bytes() == std::vector<uint8_t>(data, data + size),
                    "a message that parsed does not serialise back to its bytes");
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const Snapshots snap;
  const uint8_t kind = data[0] % 8;
  ++data, --size;
  krab::fuzz::refusals_only([&] {
    switch (kind) {
      case 0: {
        Server s = *snap.advertise;
        s.receive(parse<AdvertiseKeys>(data, size));
        break;
      }
      case 1:
        parse<Roster>(data, size);
        break;
      case 2: {
        Server s = *snap.share_keys;
        s.receive(parse<ShareKeys>(data, size));
        break;
      }
      case 3:
        parse<IncomingShares>(data, size);
        break;
      case 4: {
        Server s = *snap.masked_input;
        s.receive(parse<MaskedInput>(data, size));
        break;
      }
      case 5:
        parse<UnmaskRequest>(data, size);
        break;
      case 6: {
        // One honest answer, the fuzzed one, then unmasking with whatever was accepted.
        Server s = *snap.unmask;
        s.receive(snap.responses[0]);
        try {
          s.receive(parse<UnmaskResponse>(data, size));
        } catch (const krab::Error& e) {
          krab::fuzz::check_printable_message(e.what());
          s.receive(snap.responses[1]);  // refused: the server goes on with honest clients
        }
        s.result();
        break;
      }
      case 7: {
        const auto share = krab::federated::secagg::shamir::Share::from_bytes(data, size);
        krab::fuzz::check(share.to_bytes() == std::vector<uint8_t>(data, data + size),
                          "a share that parsed does not serialise back to its bytes");
        break;
      }
    }
  });
  return 0;
}

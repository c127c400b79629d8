// Secure aggregation: the server learns the sum of the clients' updates and nothing else about
// any one of them. Bonawitz et al. 2017, "Practical Secure Aggregation for Privacy-Preserving
// Machine Learning", the variant for a semi-honest (honest-but-curious) server.
//
// Two state machines, Client and Server, exchange plain message structs; there is no network
// and no thread here. The federated server and client carry the bytes (to_bytes/from_bytes) over
// their own transport. Client ids are integers >= 1 that double as Shamir x-coordinates.
// U1 = clients that advertised keys, U2 ⊆ U1 those that sent shares, U3 ⊆ U2 those that sent a
// masked input. The protocol, with the bytes each message costs (n = |U1|, m = vector_length):
//
//   0 AdvertiseKeys   client -> server {id, c_pk, s_pk}: two fresh X25519 public keys, c for
//                     encrypting shares, s for the pairwise mask seeds. 84 bytes.
//                     server -> all: Roster, every advertised key, once >= t advertised.
//                     16 + 72 n bytes.
//   1 ShareKeys       client u draws a random self-mask seed b_u and Shamir-splits (threshold t)
//                     both s_sk_u and b_u into one share per roster member. For each other
//                     member v it encrypts (u, v, share of s_sk_u, share of b_u) with
//                     XChaCha20-Poly1305 under agree(c_u, c_pk_v) (masking.h), a random nonce
//                     and AAD (u, v, round). 24 + 196 (n - 1) bytes. The server routes; v's
//                     IncomingShares (24 + 196 (|U2| - 1) bytes) holds the ciphertexts
//                     addressed to v by every client in U2.
//   2 MaskedInput     client u decrypts its shares and sends
//                       y_u = encode(x_u) + PRG(b_u) + sum_{v in U2, v != u} ±PRG(s_uv)  mod 2^32
//                     (+ if u < v, - if u > v; s_uv = agree(s_u, s_pk_v)), with a commitment
//                     to b_u (a keyed BLAKE2b hash bound to the round and u), so that a bad
//                     share of b_u in round 3 is detected instead of corrupting the sum.
//                     60 + 4 m bytes. In the sum over U3 the pairwise masks of survivor pairs
//                     cancel.
//   3 Unmasking       server -> U3: UnmaskRequest {survivors U3, dropped U2 \ U3}
//                     (20 + 8 |U2| bytes). Each v answers with its share of b_u for every u in
//                     U3 and its share of s_sk_u for every dropped u (28 + 68 |U2| bytes). With
//                     t answers the server reconstructs every b_u (u in U3) and subtracts
//                     PRG(b_u), reconstructs every dropped s_sk_u and cancels the masks
//                     s_uv = agree(s_sk_u, s_pk_v) that survivors v added for it, and decodes
//                     the sum. A client that sent y_u but did not answer round 3 still counts.
//                     Every reconstructed secret is checked (b_u against its commitment, s_sk_u
//                     against s_pk_u); an answer with a bad share is found by trying other sets
//                     of t answers and set aside, and the round goes on while t good ones
//                     remain (Server::result()).
//
// Why the server learns only the sum: y_u is hidden by PRG(b_u), removable only with t shares of
// b_u, which honest clients hand over only while u is a survivor; and by the pairwise masks,
// removable only with s_sk_u, whose shares they hand over only when u is dropped. A client
// therefore refuses (InvalidArgument naming the id) an UnmaskRequest that lists an id as both
// survivor and dropped, leaves out or adds an id of U2, does not list the client itself as a
// survivor, or has fewer than t survivors; and it answers round 3 at most once. Limits of the
// semi-honest variant: a server that sends different requests to different clients could collect
// t shares of b_u from some and t of s_sk_u from others unless 2t > |U2| — the malicious variant's
// consistency round (signatures over U3), not implemented here. Clients must be able to trust the
// roster's keys (no PKI here: the transport authenticates clients), and updates are clipped to
// fp.clip: clipping is all the server can check about an update it cannot see.
//
// Failures. Caller and protocol-order mistakes throw krab::InvalidArgument naming the client or
// argument (a message from the wrong round, an unknown or duplicate client, a late message, an
// update of the wrong length, a refused unmask request). A message that fails to parse, or whose
// contents contradict themselves, or a ciphertext that fails authentication, throws
// krab::CorruptData. Too few clients to go on (fewer than t at any step) throws krab::Error
// saying how many there are and t. A throwing call leaves the object as it was, so the host can
// drop the offending message and go on. Thread safety: none; one object per protocol run, driven
// by one thread (distinct objects are independent).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "federated/masking.h"
#include "federated/shamir.h"

namespace krab::federated::secagg {

// One run of the protocol. The same on the server and on every client.
struct Config {
  uint64_t round = 0;        // binds every message, mask and ciphertext to this run
  size_t vector_length = 0;  // floats per update, >= 1
  size_t threshold = 0;      // t >= 1: shares needed to reconstruct; minimum clients per step
  // n >= t: the cohort the round was announced with. A client checks t against it (2t > n,
  // client_policy.h), so the roster may list no more than n clients: with more, t would no
  // longer be a majority of them. Fewer is a dropout between fit and the roster.
  size_t clients = 0;
  FixedPoint fp;  // how updates become integers; see FixedPoint::for_clients()

  // Throws InvalidArgument if a field is out of range.
  void validate() const;
};

// ---- messages ----------------------------------------------------------------------------
// Each message's bytes start with a 4-byte tag and the round; from_bytes() accepts exactly what
// to_bytes() wrote and throws CorruptData on a wrong tag, truncated, oversized or garbage input.

struct AdvertiseKeys {
  uint64_t round = 0;
  uint64_t client_id = 0;
  PublicKey c_pk{};  // share encryption
  PublicKey s_pk{};  // pairwise mask seeds
  std::vector<uint8_t> to_bytes() const;
  static AdvertiseKeys from_bytes(const uint8_t* data, size_t size);
  static AdvertiseKeys from_bytes(const std::vector<uint8_t>& b) {
    return from_bytes(b.data(), b.size());
  }
};

struct Roster {
  uint64_t round = 0;
  std::vector<AdvertiseKeys> clients;  // ascending client_id; their `round` is not serialised
  std::vector<uint8_t> to_bytes() const;
  static Roster from_bytes(const uint8_t* data, size_t size);
  static Roster from_bytes(const std::vector<uint8_t>& b) { return from_bytes(b.data(), b.size()); }
};

struct EncryptedShare {
  uint64_t from = 0;
  uint64_t to = 0;
  std::array<uint8_t, 24> nonce{};
  std::vector<uint8_t> ciphertext;  // XChaCha20-Poly1305; the 16-byte tag included
};

struct ShareKeys {
  uint64_t round = 0;
  uint64_t client_id = 0;
  std::vector<EncryptedShare> shares;  // one per other roster member
  std::vector<uint8_t> to_bytes() const;
  static ShareKeys from_bytes(const uint8_t* data, size_t size);
  static ShareKeys from_bytes(const std::vector<uint8_t>& b) {
    return from_bytes(b.data(), b.size());
  }
};

// What the server forwards to one client: the ciphertexts addressed to it.
struct IncomingShares {
  uint64_t round = 0;
  uint64_t client_id = 0;  // the recipient
  std::vector<EncryptedShare> shares;
  std::vector<uint8_t> to_bytes() const;
  static IncomingShares from_bytes(const uint8_t* data, size_t size);
  static IncomingShares from_bytes(const std::vector<uint8_t>& b) {
    return from_bytes(b.data(), b.size());
  }
};

struct MaskedInput {
  uint64_t round = 0;
  uint64_t client_id = 0;
  std::array<uint8_t, 32> b_commitment{};  // commits to the client's self-mask seed b_u
  std::vector<uint32_t> y;
  std::vector<uint8_t> to_bytes() const;
  static MaskedInput from_bytes(const uint8_t* data, size_t size);
  static MaskedInput from_bytes(const std::vector<uint8_t>& b) {
    return from_bytes(b.data(), b.size());
  }
};

struct UnmaskRequest {
  uint64_t round = 0;
  std::vector<uint64_t> survivors;  // U3, ascending
  std::vector<uint64_t> dropped;    // U2 \ U3, ascending
  std::vector<uint8_t> to_bytes() const;
  static UnmaskRequest from_bytes(const uint8_t* data, size_t size);
  static UnmaskRequest from_bytes(const std::vector<uint8_t>& b) {
    return from_bytes(b.data(), b.size());
  }
};

// The responder's share (x = its id) of a secret of client `owner`.
struct OwnedShare {
  uint64_t owner = 0;
  shamir::Share share;
};

struct UnmaskResponse {
  uint64_t round = 0;
  uint64_t client_id = 0;
  std::vector<OwnedShare> self_mask_shares;  // shares of b_u, one per survivor u
  std::vector<OwnedShare> key_shares;        // shares of s_sk_u, one per dropped u
  std::vector<uint8_t> to_bytes() const;
  static UnmaskResponse from_bytes(const uint8_t* data, size_t size);
  static UnmaskResponse from_bytes(const std::vector<uint8_t>& b) {
    return from_bytes(b.data(), b.size());
  }
};

// ---- client ------------------------------------------------------------------------------

// One client's side of one run. Call the four steps in order, each once; calling one out of
// order throws InvalidArgument. Secret keys and seeds are wiped when the object is destroyed.
class Client {
 public:
  // 1 <= id < 2^61 - 1. Throws InvalidArgument on a bad id or config.
  Client(uint64_t id, const Config& config);
  ~Client();
  Client(Client&&) = default;
  Client& operator=(Client&&) = default;
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  uint64_t id() const { return id_; }

  // Round 0: generates the two key pairs.
  AdvertiseKeys advertise_keys();

  // Round 1. The roster must be for this round, hold at least t and at most n (config.clients)
  // clients with distinct ids and distinct keys, and list this client with the keys it
  // advertised (InvalidArgument otherwise).
  ShareKeys share_keys(const Roster& roster);

  // Round 2. `update` must have config.vector_length finite floats (InvalidArgument). Every
  // ciphertext must be addressed to this client by a distinct roster member and decrypt
  // (CorruptData naming the sender otherwise); with this client they must make at least t.
  MaskedInput masked_input(const IncomingShares& incoming, const float* update, size_t n);
  MaskedInput masked_input(const IncomingShares& incoming, const std::vector<float>& update) {
    return masked_input(incoming, update.data(), update.size());
  }

  // Round 3: the shares the request asks for, after the checks described at the top of this
  // file. Answers at most once.
  UnmaskResponse unmask(const UnmaskRequest& request);

 private:
  enum class Stage { kNew, kAdvertised, kShared, kMasked, kAnswered };
  struct Peer {
    PublicKey c_pk{}, s_pk{};
  };
  struct HeldShares {  // this client's shares of one peer's secrets
    shamir::Share s_sk, b;
  };

  void expect(Stage stage, const char* step) const;

  uint64_t id_;
  Config config_;
  Stage stage_ = Stage::kNew;
  KeyPair c_, s_;
  Seed b_{};
  std::map<uint64_t, Peer> roster_;
  std::map<uint64_t, Seed> enc_keys_;    // agree(c, c_pk_v), from round 1 for round 2
  std::map<uint64_t, HeldShares> held_;  // by owner; U2 after round 2 (this client included)
};

// ---- server ------------------------------------------------------------------------------

struct Result {
  std::vector<float> sum;            // the sum of the updates of `counted`, decoded
  std::vector<uint64_t> counted;     // U3, ascending: whose updates are in the sum
  std::vector<uint64_t> responders;  // who answered round 3 with good shares, ascending
  // Who answered round 3 with a share that disagrees with the secret the others' shares
  // reconstruct (ascending): their answers were set aside. Their own updates stay in `counted`:
  // taking one out would need both of its secrets, which no honest client hands over.
  std::vector<uint64_t> bad_shares;
};

// Bytes (to_bytes().size()) and messages per protocol round 0..3, of the messages accepted
// (a receive() that throws counts nothing). Sent bytes count every copy
// the host is expected to send: the roster to each of U1, each IncomingShares once, the unmask
// request to each of U3.
struct RoundTraffic {
  uint64_t bytes_received = 0, bytes_sent = 0;
  uint64_t messages_received = 0, messages_sent = 0;
};

// The server's side of one run. receive() accepts a step's messages while that step is open;
// the first call of the next step's getter closes it (fixes U1, U2 or U3) and a message that
// arrives after that throws InvalidArgument (drop it: that client has dropped out).
class Server {
 public:
  explicit Server(const Config& config);

  void receive(const AdvertiseKeys& msg);  // round 0
  // Closes round 0. Throws Error if fewer than t clients advertised, InvalidArgument if
  // config.fp can overflow with this many clients (FixedPoint::validate). receive() refuses an
  // advertiser beyond the n of config.clients.
  const Roster& roster();

  void receive(const ShareKeys& msg);  // round 1: needs roster() first
  // The ciphertexts for `client_id`, which must be in U2. The first call closes round 1 and
  // throws Error if fewer than t clients shared keys.
  IncomingShares shares_for(uint64_t client_id);

  void receive(const MaskedInput& msg);  // round 2: from clients of U2
  // Closes round 2; throws Error if fewer than t clients sent a masked input.
  const UnmaskRequest& unmask_request();

  void receive(const UnmaskResponse& msg);  // round 3: from clients of U3, once each
  // Closes round 3 and unmasks. Every secret is checked after reconstruction: a self-mask seed
  // against its commitment, a dropped client's key against its advertised s_pk. When the first
  // t answers fail that check, other sets of t answers are tried (leaving out one answer, then
  // two, ...; at most kMaxUnmaskTries sets); the first set that reconstructs every secret is
  // used, and every other answer whose shares disagree with those secrets is set aside
  // (Result::bad_shares). So a client that sends bad shares costs the round nothing while t
  // good answers remain. Throws Error naming how many answered and t if fewer than t did,
  // CorruptData (with the first check that failed) when no tried set of t answers reconstructs
  // every secret: more than r - t answers are bad, or a client's commitment is.
  const Result& result();
  static constexpr size_t kMaxUnmaskTries = 1000;

  const std::array<RoundTraffic, 4>& traffic() const { return traffic_; }
  const Config& config() const { return config_; }

 private:
  enum class Stage { kAdvertise, kShareKeys, kMaskedInput, kUnmask, kDone };
  struct Unmasked;  // the secrets round 3 recovers
  void expect(Stage stage, const char* what, uint64_t client_id, uint64_t msg_round) const;
  // Reconstructs every secret of the unmask request from the answers of `holders` (t of them)
  // and checks each; returns "" and fills `out`, or why not.
  std::string recover(const std::vector<uint64_t>& holders, Unmasked& out) const;
  // The answers outside `holders` whose shares disagree with the secrets `holders` recover.
  std::vector<uint64_t> disagreeing(const std::vector<uint64_t>& holders) const;

  Config config_;
  Stage stage_ = Stage::kAdvertise;
  std::map<uint64_t, AdvertiseKeys> advertised_;  // U1
  Roster roster_;
  std::map<uint64_t, std::vector<EncryptedShare>> inbox_;  // by recipient
  std::set<uint64_t> u2_, delivered_;
  std::set<uint64_t> u3_;
  std::vector<uint32_t> masked_sum_;  // sum of y_u over U3
  UnmaskRequest request_;
  // Round 3's shares, by owner then holder.
  std::map<uint64_t, std::map<uint64_t, shamir::Share>> b_shares_, sk_shares_;
  std::map<uint64_t, std::array<uint8_t, 32>> b_commitments_;  // U3's, from round 2
  std::set<uint64_t> responders_;
  Result result_;
  std::array<RoundTraffic, 4> traffic_{};
};

}  // namespace krab::federated::secagg

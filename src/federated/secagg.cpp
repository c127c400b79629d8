#include "federated/secagg.h"

#include <sodium.h>

#include <algorithm>
#include <functional>
#include <iterator>
#include <set>
#include <string_view>

#include "core/errors.h"
#include "federated/secagg_wire.h"

namespace krab::federated::secagg {
namespace {

// Distinct contexts keep the two uses of agree() apart even if a client reused one key pair for
// both (it does not; belt and braces).
constexpr std::string_view kEncryptionContext = "krab secagg v1: share encryption key";
constexpr std::string_view kMaskContext = "krab secagg v1: pairwise mask seed";
constexpr size_t kSecretBytes = 32;  // s_sk and b are both 32 bytes
constexpr std::string_view kCommitContext = "krab secagg v1: self-mask commitment";

// BLAKE2b over (context, round, id, b): binds the commitment to this round and client, so it
// cannot be replayed for another. b is 32 uniformly random bytes, so the hash reveals nothing.
std::array<uint8_t, 32> commit_self_mask(const Seed& b, uint64_t round, uint64_t id) {
  crypto_generichash_state st;
  crypto_generichash_init(&st, nullptr, 0, 32);
  crypto_generichash_update(&st, reinterpret_cast<const unsigned char*>(kCommitContext.data()),
                            kCommitContext.size());
  uint8_t ids[16];
  for (int i = 0; i < 8; ++i) {
    ids[i] = static_cast<uint8_t>(round >> (8 * i));
    ids[8 + i] = static_cast<uint8_t>(id >> (8 * i));
  }
  crypto_generichash_update(&st, ids, sizeof ids);
  crypto_generichash_update(&st, b.data(), b.size());
  std::array<uint8_t, 32> out{};
  crypto_generichash_final(&st, out.data(), out.size());
  return out;
}

// The AAD binds a ciphertext to its sender, its recipient and the run: the server cannot replay
// u's share for v to w, nor last round's share into this one.
std::array<uint8_t, 24> share_aad(uint64_t from, uint64_t to, uint64_t round) {
  std::array<uint8_t, 24> aad{};
  const uint64_t fields[3] = {from, to, round};
  for (int f = 0; f < 3; ++f)
    for (int i = 0; i < 8; ++i) aad[8 * f + i] = static_cast<uint8_t>(fields[f] >> (8 * i));
  return aad;
}

// Round 1's message from `from` to `to`: its shares of from's s_sk and b, under the key the two
// agreed on, with a fresh random nonce. The plaintext is wiped once encrypted.
EncryptedShare encrypt_share(uint64_t from, uint64_t to, uint64_t round, const Seed& key,
                             const shamir::Share& s_share, const shamir::Share& b_share) {
  wire::Writer pt(136);
  pt.u64(from);
  pt.u64(to);
  pt.blob(s_share.to_bytes());
  pt.blob(b_share.to_bytes());
  std::vector<uint8_t> plain = pt.take();

  EncryptedShare e;
  e.from = from;
  e.to = to;
  randombytes_buf(e.nonce.data(), e.nonce.size());
  const auto aad = share_aad(from, to, round);
  e.ciphertext.resize(plain.size() + crypto_aead_xchacha20poly1305_ietf_ABYTES);
  unsigned long long clen = 0;
  crypto_aead_xchacha20poly1305_ietf_encrypt(e.ciphertext.data(), &clen, plain.data(), plain.size(),
                                             aad.data(), aad.size(), nullptr, e.nonce.data(),
                                             key.data());
  e.ciphertext.resize(clen);
  sodium_memzero(plain.data(), plain.size());
  return e;
}

bool valid_id(uint64_t id) { return id >= 1 && id < shamir::kPrime; }

bool valid_share(const shamir::Share& s, uint64_t holder) {
  return s.x == holder && s.secret_length == kSecretBytes;
}

}  // namespace

void Config::validate() const {
  KRAB_CHECK_ARG(threshold >= 1, "secagg Config: threshold must be >= 1");
  KRAB_CHECK_ARG(vector_length >= 1, "secagg Config: vector_length must be >= 1");
  KRAB_CHECK_ARG(clients >= threshold, "secagg Config: clients (", clients,
                 ") must be >= threshold (", threshold, ")");
  fp.validate(1);
}

// ---- client ------------------------------------------------------------------------------

Client::Client(uint64_t id, const Config& config) : id_(id), config_(config) {
  KRAB_CHECK_ARG(valid_id(id), "secagg Client: id ", id, " must be in [1, 2^61 - 1)");
  config_.validate();
}

Client::~Client() {
  sodium_memzero(c_.sk.data(), c_.sk.size());
  sodium_memzero(s_.sk.data(), s_.sk.size());
  sodium_memzero(b_.data(), b_.size());
  for (auto& [owner, held] : enc_keys_) sodium_memzero(held.data(), held.size());
}

void Client::expect(Stage stage, const char* step) const {
  static const char* const kNames[] = {"new", "advertise_keys", "share_keys", "masked_input",
                                       "unmask"};
  KRAB_CHECK_ARG(stage_ == stage, "secagg client ", id_, ": ", step, "() called out of order",
                 " (last step done: ", kNames[static_cast<int>(stage_)], ")");
}

AdvertiseKeys Client::advertise_keys() {
  expect(Stage::kNew, "advertise_keys");
  c_ = KeyPair::generate();
  s_ = KeyPair::generate();
  stage_ = Stage::kAdvertised;
  return AdvertiseKeys{config_.round, id_, c_.pk, s_.pk};
}

ShareKeys Client::share_keys(const Roster& roster) {
  expect(Stage::kAdvertised, "share_keys");
  KRAB_CHECK_ARG(roster.round == config_.round, "secagg client ", id_, ": the roster is for round ",
                 roster.round, ", this run is round ", config_.round);
  std::map<uint64_t, Peer> peers;
  for (const AdvertiseKeys& c : roster.clients) {
    KRAB_CHECK_ARG(valid_id(c.client_id), "secagg client ", id_, ": roster has invalid id ",
                   c.client_id);
    KRAB_CHECK_ARG(peers.emplace(c.client_id, Peer{c.c_pk, c.s_pk}).second, "secagg client ", id_,
                   ": roster lists client ", c.client_id, " twice");
  }
  KRAB_CHECK_ARG(peers.size() >= config_.threshold, "secagg client ", id_, ": the roster has ",
                 peers.size(), " clients, fewer than the threshold ", config_.threshold);
  KRAB_CHECK_ARG(peers.size() <= config_.clients, "secagg client ", id_, ": the roster has ",
                 peers.size(), " clients, more than the ", config_.clients,
                 " the round was announced with (its threshold ", config_.threshold,
                 " would not be a majority of them)");
  const auto self = peers.find(id_);
  KRAB_CHECK_ARG(self != peers.end(), "secagg client ", id_, " is not on the roster");
  KRAB_CHECK_ARG(self->second.c_pk == c_.pk && self->second.s_pk == s_.pk, "secagg client ", id_,
                 ": the roster lists keys for it that it did not advertise");
  // Every public key on the roster must be distinct (Bonawitz et al. 2017, round 1): a server
  // that hands two ids the same key can make masks cancel that should not, or read shares
  // meant for someone else.
  std::map<PublicKey, uint64_t> seen;
  for (const auto& [v, peer] : peers)
    for (const PublicKey* pk : {&peer.c_pk, &peer.s_pk}) {
      const auto [it, fresh] = seen.emplace(*pk, v);
      KRAB_CHECK_ARG(fresh, "secagg client ", id_, ": the roster gives clients ", it->second,
                     " and ", v, " the same public key");
    }

  wire::ensure_sodium();
  Seed b;
  randombytes_buf(b.data(), b.size());
  std::vector<uint64_t> xs;
  for (const auto& [v, peer] : peers) xs.push_back(v);
  const auto s_shares = shamir::split(s_.sk.data(), kSecretBytes, config_.threshold, xs);
  const auto b_shares = shamir::split(b.data(), kSecretBytes, config_.threshold, xs);

  ShareKeys out{config_.round, id_, {}};
  out.shares.reserve(peers.size() - 1);
  std::map<uint64_t, Seed> keys;
  std::map<uint64_t, HeldShares> held;
  size_t i = 0;
  for (const auto& [v, peer] : peers) {
    const size_t k = i++;
    if (v == id_) {
      held[v] = HeldShares{s_shares[k], b_shares[k]};
      continue;
    }
    Seed key;
    try {
      key = agree(c_, peer.c_pk, kEncryptionContext);
    } catch (const CorruptData& e) {
      throw CorruptData(str_cat("secagg client ", id_, ": client ", v, "'s c_pk: ", e.what()));
    }
    out.shares.push_back(encrypt_share(id_, v, config_.round, key, s_shares[k], b_shares[k]));
    keys[v] = key;
  }
  roster_ = std::move(peers);
  enc_keys_ = std::move(keys);
  held_ = std::move(held);
  b_ = b;
  sodium_memzero(b.data(), b.size());
  stage_ = Stage::kShared;
  return out;
}

MaskedInput Client::masked_input(const IncomingShares& incoming, const float* update, size_t n) {
  expect(Stage::kShared, "masked_input");
  KRAB_CHECK_ARG(n == config_.vector_length, "secagg client ", id_, ": update has ", n,
                 " values, the config's vector_length is ", config_.vector_length);
  std::vector<uint32_t> y = config_.fp.encode(update, n);
  KRAB_CHECK_ARG(incoming.round == config_.round, "secagg client ", id_,
                 ": IncomingShares is for round ", incoming.round, ", this run is round ",
                 config_.round);
  KRAB_CHECK_ARG(incoming.client_id == id_, "secagg client ", id_,
                 ": got the IncomingShares of client ", incoming.client_id);

  // Decrypt everything into a local map first, so a bad ciphertext leaves the client as it was.
  std::map<uint64_t, HeldShares> held = held_;
  for (const EncryptedShare& e : incoming.shares) {
    KRAB_CHECK_ARG(e.to == id_, "secagg client ", id_, ": got a share addressed to client ", e.to);
    KRAB_CHECK_ARG(e.from != id_ && roster_.count(e.from), "secagg client ", id_,
                   ": got a share from client ", e.from, ", which is not another roster member");
    KRAB_CHECK_ARG(!held.count(e.from), "secagg client ", id_, ": got two shares from client ",
                   e.from);
    const auto aad = share_aad(e.from, id_, config_.round);
    std::vector<uint8_t> plain(e.ciphertext.size());
    unsigned long long plen = 0;
    if (e.ciphertext.size() < crypto_aead_xchacha20poly1305_ietf_ABYTES ||
        crypto_aead_xchacha20poly1305_ietf_decrypt(
            plain.data(), &plen, nullptr, e.ciphertext.data(), e.ciphertext.size(), aad.data(),
            aad.size(), e.nonce.data(), enc_keys_.at(e.from).data()) != 0)
      throw CorruptData(str_cat("secagg client ", id_, ": the share from client ", e.from,
                                " failed authentication (tampered, or not for this round)"));
    wire::Reader r(plain.data(), plen, "secagg share plaintext");
    HeldShares h;
    const uint64_t from = r.u64(), to = r.u64();
    const auto [sp, sn] = r.blob();
    h.s_sk = shamir::Share::from_bytes(sp, sn);
    const auto [bp, bn] = r.blob();
    h.b = shamir::Share::from_bytes(bp, bn);
    r.finish();
    sodium_memzero(plain.data(), plain.size());
    if (from != e.from || to != id_ || !valid_share(h.s_sk, id_) || !valid_share(h.b, id_))
      throw CorruptData(str_cat("secagg client ", id_, ": the share from client ", e.from,
                                " is not a share of 32-byte secrets for this client"));
    held.emplace(e.from, std::move(h));
  }
  if (held.size() < config_.threshold)
    throw Error(str_cat("secagg client ", id_, ": only ", held.size(),
                        " clients (itself included) completed round 1; the threshold is ",
                        config_.threshold));

  apply_mask(y, b_, config_.round, +1);
  for (const auto& [v, h] : held) {
    if (v == id_) continue;
    Seed seed;
    try {
      seed = agree(s_, roster_.at(v).s_pk, kMaskContext);
    } catch (const CorruptData& e) {
      throw CorruptData(str_cat("secagg client ", id_, ": client ", v, "'s s_pk: ", e.what()));
    }
    // The lower id adds, the higher subtracts: the pair's masks cancel in the sum.
    apply_mask(y, seed, config_.round, id_ < v ? +1 : -1);
    sodium_memzero(seed.data(), seed.size());
  }
  held_ = std::move(held);
  stage_ = Stage::kMasked;
  return MaskedInput{config_.round, id_, commit_self_mask(b_, config_.round, id_), std::move(y)};
}

UnmaskResponse Client::unmask(const UnmaskRequest& request) {
  KRAB_CHECK_ARG(stage_ != Stage::kAnswered, "secagg client ", id_,
                 " refuses a second unmask request (it answers round 3 once)");
  expect(Stage::kMasked, "unmask");
  KRAB_CHECK_ARG(request.round == config_.round, "secagg client ", id_,
                 ": the unmask request is for round ", request.round, ", this run is round ",
                 config_.round);
  std::set<uint64_t> survivors, dropped;
  for (uint64_t u : request.survivors)
    KRAB_CHECK_ARG(survivors.insert(u).second, "secagg client ", id_,
                   " refuses the unmask request: survivor ", u, " is listed twice");
  for (uint64_t u : request.dropped) {
    KRAB_CHECK_ARG(!survivors.count(u), "secagg client ", id_,
                   " refuses the unmask request: client ", u,
                   " is listed both as a survivor and as dropped");
    KRAB_CHECK_ARG(dropped.insert(u).second, "secagg client ", id_,
                   " refuses the unmask request: dropped client ", u, " is listed twice");
  }
  KRAB_CHECK_ARG(survivors.count(id_), "secagg client ", id_,
                 " refuses the unmask request: it is not listed as a survivor");
  KRAB_CHECK_ARG(survivors.size() >= config_.threshold, "secagg client ", id_,
                 " refuses the unmask request: ", survivors.size(),
                 " survivors, fewer than the threshold ", config_.threshold);
  for (const auto* list : {&survivors, &dropped})
    for (uint64_t u : *list)
      KRAB_CHECK_ARG(held_.count(u), "secagg client ", id_, " refuses the unmask request: client ",
                     u, " did not share keys with it in round 1");
  for (const auto& [u, h] : held_)
    KRAB_CHECK_ARG(survivors.count(u) || dropped.count(u), "secagg client ", id_,
                   " refuses the unmask request: it leaves out client ", u, " of round 1");

  UnmaskResponse out{config_.round, id_, {}, {}};
  for (uint64_t u : survivors) out.self_mask_shares.push_back(OwnedShare{u, held_.at(u).b});
  for (uint64_t u : dropped) out.key_shares.push_back(OwnedShare{u, held_.at(u).s_sk});
  stage_ = Stage::kAnswered;
  return out;
}

// ---- server ------------------------------------------------------------------------------

Server::Server(const Config& config) : config_(config) {
  config_.validate();
  masked_sum_.assign(config_.vector_length, 0);
}

void Server::expect(Stage stage, const char* what, uint64_t client_id, uint64_t msg_round) const {
  KRAB_CHECK_ARG(msg_round == config_.round, "secagg server: client ", client_id, "'s ", what,
                 " is for round ", msg_round, ", this run is round ", config_.round);
  KRAB_CHECK_ARG(stage_ == stage, "secagg server round ", config_.round, ": client ", client_id,
                 "'s ", what, " arrived ", stage_ < stage ? "before" : "after",
                 " its step was open");
}

void Server::receive(const AdvertiseKeys& msg) {
  expect(Stage::kAdvertise, "AdvertiseKeys", msg.client_id, msg.round);
  KRAB_CHECK_ARG(valid_id(msg.client_id), "secagg server: client id ", msg.client_id,
                 " must be in [1, 2^61 - 1)");
  KRAB_CHECK_ARG(!advertised_.count(msg.client_id), "secagg server: client ", msg.client_id,
                 " advertised keys twice");
  KRAB_CHECK_ARG(advertised_.size() < config_.clients, "secagg server round ", config_.round,
                 ": client ", msg.client_id, " would be advertiser ", advertised_.size() + 1,
                 " of a round announced for ", config_.clients);
  advertised_[msg.client_id] = msg;
  traffic_[0].bytes_received += msg.to_bytes().size();
  traffic_[0].messages_received += 1;
}

const Roster& Server::roster() {
  if (stage_ != Stage::kAdvertise) return roster_;
  if (advertised_.size() < config_.threshold)
    throw Error(str_cat("secagg server round ", config_.round, ": only ", advertised_.size(),
                        " clients advertised keys; the threshold is ", config_.threshold));
  config_.fp.validate(advertised_.size());
  roster_.round = config_.round;
  for (const auto& [id, keys] : advertised_) roster_.clients.push_back(keys);
  stage_ = Stage::kShareKeys;
  traffic_[0].bytes_sent += roster_.to_bytes().size() * roster_.clients.size();
  traffic_[0].messages_sent += roster_.clients.size();
  return roster_;
}

void Server::receive(const ShareKeys& msg) {
  const uint64_t u = msg.client_id;
  expect(Stage::kShareKeys, "ShareKeys", u, msg.round);
  KRAB_CHECK_ARG(advertised_.count(u), "secagg server: client ", u, " is not on the roster");
  KRAB_CHECK_ARG(!u2_.count(u), "secagg server: client ", u, " sent ShareKeys twice");
  std::set<uint64_t> recipients;
  for (const EncryptedShare& e : msg.shares) {
    if (e.from != u || e.to == u || !advertised_.count(e.to) || !recipients.insert(e.to).second)
      throw CorruptData(str_cat("secagg server: client ", u, "'s ShareKeys has a share from ",
                                e.from, " to ", e.to, " (a duplicate, or not a roster member)"));
  }
  if (recipients.size() + 1 != advertised_.size())
    throw CorruptData(str_cat("secagg server: client ", u, "'s ShareKeys has ", recipients.size(),
                              " shares for a roster of ", advertised_.size()));
  for (const EncryptedShare& e : msg.shares) inbox_[e.to].push_back(e);
  u2_.insert(u);
  traffic_[1].bytes_received += msg.to_bytes().size();
  traffic_[1].messages_received += 1;
}

IncomingShares Server::shares_for(uint64_t client_id) {
  KRAB_CHECK_ARG(stage_ != Stage::kAdvertise, "secagg server: shares_for(", client_id,
                 ") before round 1 began (call roster() first)");
  if (stage_ == Stage::kShareKeys) {
    if (u2_.size() < config_.threshold)
      throw Error(str_cat("secagg server round ", config_.round, ": only ", u2_.size(),
                          " clients shared keys; the threshold is ", config_.threshold));
    stage_ = Stage::kMaskedInput;
  }
  KRAB_CHECK_ARG(u2_.count(client_id), "secagg server: client ", client_id,
                 " did not share keys in round 1");
  IncomingShares out{config_.round, client_id, {}};
  if (const auto it = inbox_.find(client_id); it != inbox_.end()) out.shares = it->second;
  if (delivered_.insert(client_id).second) {
    traffic_[1].bytes_sent += out.to_bytes().size();
    traffic_[1].messages_sent += 1;
  }
  return out;
}

void Server::receive(const MaskedInput& msg) {
  const uint64_t u = msg.client_id;
  expect(Stage::kMaskedInput, "MaskedInput", u, msg.round);
  KRAB_CHECK_ARG(u2_.count(u), "secagg server: client ", u, " did not share keys in round 1");
  KRAB_CHECK_ARG(!u3_.count(u), "secagg server: client ", u, " sent MaskedInput twice");
  KRAB_CHECK_ARG(msg.y.size() == config_.vector_length, "secagg server: client ", u,
                 "'s masked input has ", msg.y.size(), " values, the config's vector_length is ",
                 config_.vector_length);
  add_to(masked_sum_, msg.y);
  b_commitments_[u] = msg.b_commitment;
  u3_.insert(u);
  traffic_[2].bytes_received += msg.to_bytes().size();
  traffic_[2].messages_received += 1;
}

const UnmaskRequest& Server::unmask_request() {
  KRAB_CHECK_ARG(stage_ >= Stage::kMaskedInput, "secagg server: unmask_request() before round 2");
  if (stage_ != Stage::kMaskedInput) return request_;
  if (u3_.size() < config_.threshold)
    throw Error(str_cat("secagg server round ", config_.round, ": only ", u3_.size(),
                        " clients sent a masked input; the threshold is ", config_.threshold));
  request_.round = config_.round;
  request_.survivors.assign(u3_.begin(), u3_.end());
  std::set_difference(u2_.begin(), u2_.end(), u3_.begin(), u3_.end(),
                      std::back_inserter(request_.dropped));
  stage_ = Stage::kUnmask;
  traffic_[3].bytes_sent += request_.to_bytes().size() * u3_.size();
  traffic_[3].messages_sent += u3_.size();
  return request_;
}

void Server::receive(const UnmaskResponse& msg) {
  const uint64_t v = msg.client_id;
  expect(Stage::kUnmask, "UnmaskResponse", v, msg.round);
  KRAB_CHECK_ARG(u3_.count(v), "secagg server: client ", v, " is not a survivor of round 2");
  KRAB_CHECK_ARG(!responders_.count(v), "secagg server: client ", v, " answered round 3 twice");
  // The response must cover exactly the request's lists, each owner once, with v's own shares.
  const auto covers = [&](const std::vector<OwnedShare>& got, const std::vector<uint64_t>& want) {
    std::vector<uint64_t> owners;
    for (const OwnedShare& s : got) {
      if (!valid_share(s.share, v)) return false;
      owners.push_back(s.owner);
    }
    std::sort(owners.begin(), owners.end());
    return owners == want;  // `want` is ascending and duplicate-free
  };
  if (!covers(msg.self_mask_shares, request_.survivors) ||
      !covers(msg.key_shares, request_.dropped))
    throw CorruptData(
        str_cat("secagg server: client ", v, "'s unmask response does not match the request"));
  for (const OwnedShare& s : msg.self_mask_shares) b_shares_[s.owner][v] = s.share;
  for (const OwnedShare& s : msg.key_shares) sk_shares_[s.owner][v] = s.share;
  responders_.insert(v);
  traffic_[3].bytes_received += msg.to_bytes().size();
  traffic_[3].messages_received += 1;
}

// Round 3's secrets, wiped when done with.
struct Server::Unmasked {
  std::map<uint64_t, Seed> b;      // survivors' self-mask seeds
  std::map<uint64_t, KeyPair> sk;  // dropped clients' mask key pairs
  ~Unmasked() {
    for (auto& [u, seed] : b) sodium_memzero(seed.data(), seed.size());
    for (auto& [u, kp] : sk) sodium_memzero(kp.sk.data(), kp.sk.size());
  }
};

namespace {

// `owner`'s shares held by `holders`, in that order.
std::vector<shamir::Share> shares_of(const std::map<uint64_t, shamir::Share>& by_holder,
                                     const std::vector<uint64_t>& holders) {
  std::vector<shamir::Share> out;
  for (uint64_t h : holders) out.push_back(by_holder.at(h));
  return out;
}

// The sets of t answers result() tries, in order: the first t; then, leaving out one answer at
// a time, the first t of the rest; then two at a time; ... Each distinct set is passed to `try_`
// until it returns true (then true) or `max_tries` sets were tried (then false).
bool for_each_holder_set(const std::vector<uint64_t>& answered, size_t t, size_t max_tries,
                         const std::function<bool(const std::vector<uint64_t>&)>& try_) {
  std::set<std::vector<uint64_t>> tried;
  const size_t r = answered.size();
  for (size_t k = 0; k + t <= r; ++k) {
    std::vector<size_t> out(k);  // the left-out positions, ascending
    for (size_t i = 0; i < k; ++i) out[i] = i;
    for (;;) {
      std::vector<uint64_t> holders;
      for (size_t i = 0, o = 0; i < r && holders.size() < t; ++i) {
        if (o < k && out[o] == i) {
          ++o;
          continue;
        }
        holders.push_back(answered[i]);
      }
      if (tried.insert(holders).second) {
        if (try_(holders)) return true;
        if (tried.size() >= max_tries) return false;
      }
      // The next k-combination of positions, in lexicographic order.
      size_t i = k;
      while (i > 0 && out[i - 1] == r - k + i - 1) --i;
      if (i == 0) break;
      ++out[i - 1];
      for (size_t j = i; j < k; ++j) out[j] = out[j - 1] + 1;
    }
  }
  return false;
}

}  // namespace

std::string Server::recover(const std::vector<uint64_t>& holders, Unmasked& out) const {
  const size_t t = config_.threshold;
  try {
    for (uint64_t u : request_.survivors) {
      std::vector<uint8_t> b = shamir::combine(shares_of(b_shares_.at(u), holders), t);
      Seed& seed = out.b[u];
      std::copy(b.begin(), b.end(), seed.begin());
      sodium_memzero(b.data(), b.size());
      // A wrong share makes a wrong seed, and that must be caught, never a wrong sum.
      if (commit_self_mask(seed, config_.round, u) != b_commitments_.at(u))
        return str_cat("the reconstructed self-mask seed of client ", u,
                       " does not match its commitment");
    }
    for (uint64_t u : request_.dropped) {
      std::vector<uint8_t> sk_bytes = shamir::combine(shares_of(sk_shares_.at(u), holders), t);
      SecretKey sk;
      std::copy(sk_bytes.begin(), sk_bytes.end(), sk.begin());
      sodium_memzero(sk_bytes.data(), sk_bytes.size());
      KeyPair& kp = out.sk[u] = KeyPair::from_secret(sk);
      sodium_memzero(sk.data(), sk.size());
      if (kp.pk != advertised_.at(u).s_pk)
        return str_cat("the reconstructed key of dropped client ", u,
                       " does not match its advertised s_pk");
    }
  } catch (const CorruptData& e) {
    return e.what();  // shares of no single polynomial
  }
  return "";
}

std::vector<uint64_t> Server::disagreeing(const std::vector<uint64_t>& holders) const {
  std::vector<uint64_t> bad;
  for (uint64_t v : responders_) {
    if (std::find(holders.begin(), holders.end(), v) != holders.end()) continue;
    const std::vector<uint64_t> w = shamir::lagrange_weights(holders, v);
    bool agrees = true;
    for (const auto* shares : {&b_shares_, &sk_shares_})
      for (const auto& [owner, by_holder] : *shares)
        agrees = agrees && shamir::share_at(shares_of(by_holder, holders), w, v) == by_holder.at(v);
    if (!agrees) bad.push_back(v);
  }
  return bad;
}

const Result& Server::result() {
  if (stage_ == Stage::kDone) return result_;
  KRAB_CHECK_ARG(stage_ == Stage::kUnmask, "secagg server: result() before round 3");
  const size_t t = config_.threshold;
  if (responders_.size() < t)
    throw Error(str_cat("secagg server round ", config_.round, ": only ", responders_.size(),
                        " of ", u3_.size(), " survivors answered the unmask request; ",
                        "the threshold is ", t));

  // Every secret is checked after reconstruction, so a set of t answers that passes holds no
  // bad share; a bad share elsewhere then shows as a disagreement with those secrets.
  const std::vector<uint64_t> answered(responders_.begin(), responders_.end());
  Unmasked secrets;
  std::vector<uint64_t> holders;
  std::string first_failure;
  const bool found = for_each_holder_set(answered, t, kMaxUnmaskTries,
                                         [&](const std::vector<uint64_t>& candidate) {
                                           Unmasked attempt;
                                           const std::string why = recover(candidate, attempt);
                                           if (first_failure.empty()) first_failure = why;
                                           if (!why.empty()) return false;
                                           secrets.b.swap(attempt.b);
                                           secrets.sk.swap(attempt.sk);
                                           holders = candidate;
                                           return true;
                                         });
  if (!found)
    throw CorruptData(str_cat("secagg server round ", config_.round, ": ", first_failure,
                              " (a bad share in round 3), and no other ", t, " of the ",
                              answered.size(), " answers reconstruct every secret"));

  std::vector<uint32_t> sum = masked_sum_;
  for (auto& [u, seed] : secrets.b) apply_mask(sum, seed, config_.round, -1);
  for (auto& [u, kp] : secrets.sk)
    for (uint64_t v : request_.survivors) {
      Seed seed = agree(kp, advertised_.at(v).s_pk, kMaskContext);
      // Survivor v added +PRG(s_uv) if v < u and -PRG(s_uv) if v > u; undo that.
      apply_mask(sum, seed, config_.round, v < u ? -1 : +1);
      sodium_memzero(seed.data(), seed.size());
    }
  result_.sum = config_.fp.decode_sum(sum, u3_.size());
  result_.counted = request_.survivors;
  result_.bad_shares = disagreeing(holders);
  for (uint64_t v : answered)
    if (!std::binary_search(result_.bad_shares.begin(), result_.bad_shares.end(), v))
      result_.responders.push_back(v);
  stage_ = Stage::kDone;
  return result_;
}

}  // namespace krab::federated::secagg

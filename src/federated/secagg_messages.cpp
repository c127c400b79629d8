// The wire formats of secagg.h's messages. All integers little-endian; counts are u32 except
// MaskedInput's length (u64); nested shares are u32 length-prefixed Share::to_bytes() blobs.
#include <sodium.h>

#include "core/errors.h"
#include "federated/secagg.h"
#include "federated/secagg_wire.h"

namespace krab::federated::secagg {
namespace {

constexpr char kAdvertiseMagic[5] = "SA0K";
constexpr char kRosterMagic[5] = "SA0R";
constexpr char kShareKeysMagic[5] = "SA1S";
constexpr char kIncomingMagic[5] = "SA1I";
constexpr char kMaskedMagic[5] = "SA2Y";
constexpr char kRequestMagic[5] = "SA3Q";
constexpr char kResponseMagic[5] = "SA3A";

// XChaCha20-Poly1305's tag is 16 bytes; the plaintext (two 32-byte-secret shares and the two
// ids) is 136, so anything much larger is garbage. The bound keeps a forged length from
// making from_bytes() copy megabytes.
constexpr size_t kMaxCiphertext = 4096;
constexpr size_t kMinEncryptedShare = 8 + 8 + 24 + 4;
constexpr size_t kMinOwnedShare = 8 + 4 + 16;

void write_key(wire::Writer& w, const std::array<uint8_t, 32>& k) { w.bytes(k.data(), k.size()); }

void write_encrypted(wire::Writer& w, const std::vector<EncryptedShare>& shares) {
  w.u32(static_cast<uint32_t>(shares.size()));
  for (const EncryptedShare& e : shares) {
    w.u64(e.from);
    w.u64(e.to);
    w.bytes(e.nonce.data(), e.nonce.size());
    w.blob(e.ciphertext);
  }
}

std::vector<EncryptedShare> read_encrypted(wire::Reader& r) {
  std::vector<EncryptedShare> shares(r.count(kMinEncryptedShare));
  for (EncryptedShare& e : shares) {
    e.from = r.u64();
    e.to = r.u64();
    r.bytes(e.nonce.data(), e.nonce.size());
    const auto [p, n] = r.blob();
    if (n < crypto_aead_xchacha20poly1305_ietf_ABYTES || n > kMaxCiphertext)
      r.fail(str_cat("ciphertext of ", n, " bytes from client ", e.from));
    e.ciphertext.assign(p, p + n);
  }
  return shares;
}

void write_ids(wire::Writer& w, const std::vector<uint64_t>& ids) {
  w.u32(static_cast<uint32_t>(ids.size()));
  for (uint64_t id : ids) w.u64(id);
}

std::vector<uint64_t> read_ids(wire::Reader& r) {
  std::vector<uint64_t> ids(r.count(8));
  for (uint64_t& id : ids) id = r.u64();
  return ids;
}

void write_owned(wire::Writer& w, const std::vector<OwnedShare>& shares) {
  w.u32(static_cast<uint32_t>(shares.size()));
  for (const OwnedShare& s : shares) {
    w.u64(s.owner);
    w.blob(s.share.to_bytes());
  }
}

std::vector<OwnedShare> read_owned(wire::Reader& r) {
  std::vector<OwnedShare> shares(r.count(kMinOwnedShare));
  for (OwnedShare& s : shares) {
    s.owner = r.u64();
    const auto [p, n] = r.blob();
    s.share = shamir::Share::from_bytes(p, n);
  }
  return shares;
}

}  // namespace

std::vector<uint8_t> AdvertiseKeys::to_bytes() const {
  wire::Writer w(84);
  w.magic(kAdvertiseMagic);
  w.u64(round);
  w.u64(client_id);
  write_key(w, c_pk);
  write_key(w, s_pk);
  return w.take();
}

AdvertiseKeys AdvertiseKeys::from_bytes(const uint8_t* data, size_t size) {
  wire::Reader r(data, size, "secagg AdvertiseKeys");
  r.magic(kAdvertiseMagic);
  AdvertiseKeys m;
  m.round = r.u64();
  m.client_id = r.u64();
  r.bytes(m.c_pk.data(), 32);
  r.bytes(m.s_pk.data(), 32);
  r.finish();
  return m;
}

std::vector<uint8_t> Roster::to_bytes() const {
  wire::Writer w(16 + 72 * clients.size());
  w.magic(kRosterMagic);
  w.u64(round);
  w.u32(static_cast<uint32_t>(clients.size()));
  for (const AdvertiseKeys& c : clients) {
    w.u64(c.client_id);
    write_key(w, c.c_pk);
    write_key(w, c.s_pk);
  }
  return w.take();
}

Roster Roster::from_bytes(const uint8_t* data, size_t size) {
  wire::Reader r(data, size, "secagg Roster");
  r.magic(kRosterMagic);
  Roster m;
  m.round = r.u64();
  m.clients.resize(r.count(72));
  for (AdvertiseKeys& c : m.clients) {
    c.round = m.round;
    c.client_id = r.u64();
    r.bytes(c.c_pk.data(), 32);
    r.bytes(c.s_pk.data(), 32);
  }
  r.finish();
  return m;
}

// ShareKeys and IncomingShares have one layout: tag, round, client id, the ciphertexts.
template <typename M>
std::vector<uint8_t> share_list_bytes(const char (&magic)[5], const M& m) {
  wire::Writer w(24 + 196 * m.shares.size());
  w.magic(magic);
  w.u64(m.round);
  w.u64(m.client_id);
  write_encrypted(w, m.shares);
  return w.take();
}

template <typename M>
M share_list_from(const char (&magic)[5], const char* what, const uint8_t* data, size_t size) {
  wire::Reader r(data, size, what);
  r.magic(magic);
  M m;
  m.round = r.u64();
  m.client_id = r.u64();
  m.shares = read_encrypted(r);
  r.finish();
  return m;
}

std::vector<uint8_t> ShareKeys::to_bytes() const {
  return share_list_bytes(kShareKeysMagic, *this);
}

ShareKeys ShareKeys::from_bytes(const uint8_t* data, size_t size) {
  return share_list_from<ShareKeys>(kShareKeysMagic, "secagg ShareKeys", data, size);
}

std::vector<uint8_t> IncomingShares::to_bytes() const {
  return share_list_bytes(kIncomingMagic, *this);
}

IncomingShares IncomingShares::from_bytes(const uint8_t* data, size_t size) {
  return share_list_from<IncomingShares>(kIncomingMagic, "secagg IncomingShares", data, size);
}

std::vector<uint8_t> MaskedInput::to_bytes() const {
  wire::Writer w(60 + 4 * y.size());
  w.magic(kMaskedMagic);
  w.u64(round);
  w.u64(client_id);
  w.bytes(b_commitment.data(), b_commitment.size());
  w.u64(y.size());
  for (uint32_t v : y) w.u32(v);
  return w.take();
}

MaskedInput MaskedInput::from_bytes(const uint8_t* data, size_t size) {
  wire::Reader r(data, size, "secagg MaskedInput");
  r.magic(kMaskedMagic);
  MaskedInput m;
  m.round = r.u64();
  m.client_id = r.u64();
  r.bytes(m.b_commitment.data(), m.b_commitment.size());
  const uint64_t n = r.u64();
  if (n != r.remaining() / 4 || r.remaining() % 4 != 0)
    r.fail(str_cat("length ", n, " does not match the ", r.remaining(), " bytes left"));
  m.y.resize(n);
  for (uint32_t& v : m.y) v = r.u32();
  r.finish();
  return m;
}

std::vector<uint8_t> UnmaskRequest::to_bytes() const {
  wire::Writer w(20 + 8 * (survivors.size() + dropped.size()));
  w.magic(kRequestMagic);
  w.u64(round);
  write_ids(w, survivors);
  write_ids(w, dropped);
  return w.take();
}

UnmaskRequest UnmaskRequest::from_bytes(const uint8_t* data, size_t size) {
  wire::Reader r(data, size, "secagg UnmaskRequest");
  r.magic(kRequestMagic);
  UnmaskRequest m;
  m.round = r.u64();
  m.survivors = read_ids(r);
  m.dropped = read_ids(r);
  r.finish();
  return m;
}

std::vector<uint8_t> UnmaskResponse::to_bytes() const {
  wire::Writer w(28 + 68 * (self_mask_shares.size() + key_shares.size()));
  w.magic(kResponseMagic);
  w.u64(round);
  w.u64(client_id);
  write_owned(w, self_mask_shares);
  write_owned(w, key_shares);
  return w.take();
}

UnmaskResponse UnmaskResponse::from_bytes(const uint8_t* data, size_t size) {
  wire::Reader r(data, size, "secagg UnmaskResponse");
  r.magic(kResponseMagic);
  UnmaskResponse m;
  m.round = r.u64();
  m.client_id = r.u64();
  m.self_mask_shares = read_owned(r);
  m.key_shares = read_owned(r);
  r.finish();
  return m;
}

}  // namespace krab::federated::secagg

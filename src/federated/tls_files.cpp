#include "federated/tls_files.h"

#include <grpc/support/log.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>

#include "core/errors.h"
#include "core/fs.h"

namespace krab::federated {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using Bio = std::unique_ptr<BIO, BioFree>;
using Cert = std::unique_ptr<X509, X509Free>;
using Key = std::unique_ptr<EVP_PKEY, KeyFree>;

Bio memory_bio(const std::string& text) {
  return Bio(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
}

std::string read_named(const std::string& path, const char* what) {
  KRAB_CHECK_ARG(!path.empty(), what, " is required (a PEM file)");
  KRAB_CHECK_ARG(core::path_exists(path), what, ": file '", path, "' does not exist");
  return core::read_file(path);
}

// The first certificate in `pem`, or null. Clears OpenSSL's error queue either way, so a failed
// parse here cannot surface later as someone else's error.
Cert first_certificate(const std::string& pem) {
  Bio bio = memory_bio(pem);
  Cert c(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  return c;
}

void log_nothing(gpr_log_func_args*) {}

}  // namespace

std::string read_certificates(const std::string& path, const char* what) {
  const std::string pem = read_named(path, what);
  KRAB_CHECK_ARG(pem.find("PRIVATE KEY-----") == std::string::npos, what, ": '", path,
                 "' holds a private key; it takes a PEM certificate (-----BEGIN CERTIFICATE-----)");
  KRAB_CHECK_ARG(first_certificate(pem) != nullptr, what, ": '", path,
                 "' is not a PEM certificate (-----BEGIN CERTIFICATE-----)");
  return pem;
}

std::string read_private_key(const std::string& path, const char* what) {
  const std::string pem = read_named(path, what);
  Bio bio = memory_bio(pem);
  // An empty passphrase callback: an encrypted key fails here instead of prompting.
  Key key(PEM_read_bio_PrivateKey(
      bio.get(), nullptr, [](char*, int, int, void*) { return 0; }, nullptr));
  ERR_clear_error();
  KRAB_CHECK_ARG(key != nullptr, what, ": '", path,
                 "' is not an unencrypted PEM private key (-----BEGIN PRIVATE KEY-----)");
  return pem;
}

void check_key_matches(const std::string& cert_pem, const std::string& key_pem,
                       const std::string& cert_path, const std::string& key_path) {
  Cert cert = first_certificate(cert_pem);
  Bio bio = memory_bio(key_pem);
  Key key(PEM_read_bio_PrivateKey(
      bio.get(), nullptr, [](char*, int, int, void*) { return 0; }, nullptr));
  const bool match = cert && key && X509_check_private_key(cert.get(), key.get()) == 1;
  ERR_clear_error();
  KRAB_CHECK_ARG(match, "the key '", key_path, "' does not belong to the certificate '", cert_path,
                 "'");
}

std::string sha256(const std::string& text) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  KRAB_CHECK(EVP_Digest(text.data(), text.size(), out, &n, EVP_sha256(), nullptr) == 1 && n == 32,
             "SHA-256 failed");
  return std::string(reinterpret_cast<const char*>(out), n);
}

std::string client_token(const TokenSources& s, std::vector<std::string>& warnings) {
  KRAB_CHECK_ARG(s.file.empty() || s.flag.empty(),
                 "give the token once: --token-file or --token, not both");
  if (!s.file.empty()) {
    struct stat st {};
    KRAB_CHECK_ARG(::stat(s.file.c_str(), &st) == 0 && S_ISREG(st.st_mode), "--token-file ", s.file,
                   ": no such file");
    std::string token = core::read_file(s.file);
    while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back())))
      token.pop_back();
    KRAB_CHECK_ARG(!token.empty(), "--token-file ", s.file, " is empty");
    if ((st.st_mode & (S_IRGRP | S_IROTH)) != 0) {
      char mode[8];
      std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
      warnings.push_back(str_cat("--token-file ", s.file, " is readable by other users (mode ",
                                 mode, "); chmod 600 it"));
    }
    return token;
  }
  if (!s.flag.empty()) {
    warnings.push_back(
        "--token puts the token on the command line, where `ps` shows it to every user of this "
        "machine; use --token-file FILE or the environment variable KRAB_FL_TOKEN");
    return s.flag;
  }
  KRAB_CHECK_ARG(s.env != nullptr && *s.env != '\0',
                 "fl-client needs its token: --token-file FILE, or the environment variable "
                 "KRAB_FL_TOKEN (--token also works, but `ps` shows it to every local user)");
  return s.env;
}

void quiet_grpc_logs() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (std::getenv("KRAB_GRPC_LOG") == nullptr) gpr_set_log_function(log_nothing);
  });
}

}  // namespace krab::federated

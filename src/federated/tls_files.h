// Credentials of the federated transport, checked before gRPC sees them: the PEM files of its
// TLS, and a client's token.
//
// gRPC accepts any bytes as a certificate or key and fails later: at the handshake, with its own
// log lines (file:line, memory addresses) and a generic "unavailable". A user who passed the key
// where the CA belongs, or a key that does not match its certificate, needs one line naming the
// file and what is wrong with it. These functions parse the files with OpenSSL and throw
// krab::InvalidArgument (exit 2) whose message names the option (`what`: "--ca",
// "federated.tls_cert", ...) and the path. They return the file's text for gRPC.
//
// Pure apart from reading the named files; thread-safe.
#pragma once

#include <string>
#include <vector>

namespace krab::federated {

// Where an fl-client's token comes from. A token on the command line (--token) is in
// /proc/PID/cmdline, which `ps` shows to every user of the machine; a file only its owner can
// read, or the environment (/proc/PID/environ is private to the user), is not.
struct TokenSources {
  std::string file;           // --token-file FILE
  std::string flag;           // --token TOKEN
  const char* env = nullptr;  // KRAB_FL_TOKEN, as the CLI read it (nullptr: unset)
};

// The token: --token-file's contents (trailing whitespace and newline removed), else --token,
// else KRAB_FL_TOKEN. InvalidArgument (exit 2) naming the source when --token-file and --token
// are both given, none is, or the file is missing, unreadable or empty. Appends to `warnings`
// (one line each, for stderr) when the token is on the command line, and when the token file
// is readable by other users (it still works: a Kubernetes secret volume is 0644 by default,
// in a directory only the pod sees; chmod 600 elsewhere).
std::string client_token(const TokenSources& sources, std::vector<std::string>& warnings);

// One or more X.509 certificates (a CA bundle, or a certificate chain whose first entry is the
// leaf). A private key, an empty file or anything that does not parse is refused.
std::string read_certificates(const std::string& path, const char* what);

// A private key (any type OpenSSL reads, unencrypted: there is no passphrase prompt).
std::string read_private_key(const std::string& path, const char* what);

// Refuses a key that is not the private half of the first certificate in `cert_pem`.
void check_key_matches(const std::string& cert_pem, const std::string& key_pem,
                       const std::string& cert_path, const std::string& key_path);

// SHA-256 of `text` (32 raw bytes): tokens are kept and looked up by digest, so the lookup's
// timing depends on a hash of the guess, not on how many leading characters it got right.
std::string sha256(const std::string& text);

// Sends gRPC's own log lines nowhere unless KRAB_GRPC_LOG is set in the environment (to debug
// the transport); krab reports every failure itself, in one line. Idempotent.
void quiet_grpc_logs();

}  // namespace krab::federated

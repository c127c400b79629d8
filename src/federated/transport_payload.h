// What each side of the federated transport makes of the bytes the other side sent, without
// gRPC: the same functions FederationClient::next_task() and the server's fit() use on the
// messages gRPC hands them, exposed over serialised protobuf bytes so tests and the fuzzers
// (tests/fuzz/) can feed them anything. Defined in transport.cpp, the only file that knows
// fl.proto.
//
// Both throw CorruptData when the bytes do not parse as the message or carry something no
// krab sends (an update whose length is not a whole number of float32 values, a task kind this
// krab does not know), and InvalidArgument for a secure-aggregation stage outside 1..3. They
// never read past the bytes given; what the tensors hold is for the caller to check (its size
// against the model's).
#pragma once

#include <string>

#include "federated/transport.h"

namespace krab::federated {

// A serialised wire::Task (the GetTask reply) -> the client's RemoteTask.
RemoteTask decode_task(const std::string& bytes);

// A serialised wire::TaskResult answering a fit task -> the server's FitReply: the update as a
// float tensor, or with `secure` the secure-aggregation message bytes. `who` ("client 'a'")
// starts every message.
FitReply decode_fit_result(const std::string& bytes, bool secure, const std::string& who);

}  // namespace krab::federated

// What a failure inside a model's own code (a TorchScript method, or a LibTorch op a built-in
// model calls) looks like to krab: one line a user can act on, and the full text kept aside.
//
// LibTorch reports an op that fails inside the TorchScript interpreter as a std::runtime_error
// whose text is "The following operation failed in the TorchScript interpreter.", then two
// tracebacks (the serialized code's and, when the file kept it, the Python source's), and only
// then "RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x784 and 100x10)". A c10::Error
// raised outside the interpreter carries a C++ backtrace after its message instead. Neither
// belongs on a user's terminal first: krab prints the cause, and the traceback goes to a file or
// behind --verbose (train/dry_run.h, the CLI).
#pragma once

#include <exception>
#include <string>

#include "core/errors.h"

namespace krab::models {

// A model's forward, loss or backward failed in code krab did not write. An InvalidArgument
// (exit 2): the model does not fit the data or the job. what() is one line naming the model
// and the method; cause() the library's own first line, without traceback or exception class
// ("mat1 and mat2 must have the same dtype"); details() the library's full text (tracebacks
// included), for a file or --verbose.
class ForwardError : public InvalidArgument {
 public:
  ForwardError(const std::string& what, std::string cause, std::string details)
      : InvalidArgument(what), cause_(std::move(cause)), details_(std::move(details)) {}
  const std::string& cause() const { return cause_; }
  const std::string& details() const { return details_; }

 private:
  std::string cause_, details_;
};

// The cause and the full text of an exception thrown by LibTorch or the TorchScript
// interpreter (anything but a krab::Error): for the interpreter's text, the line after the
// tracebacks, without the "RuntimeError: " prefix (a Python exception raised by the script
// keeps its class: "ValueError: ..."); for a c10::Error, the first line of its message (details:
// the message without LibTorch's C++ backtrace); otherwise what()'s first line.
struct LibraryError {
  std::string cause, details;
};
LibraryError describe_library_error(const std::exception& e);

}  // namespace krab::models

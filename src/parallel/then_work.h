// ThenWork: a comm::Work made of other Works and a continuation — waits for `deps` in order,
// then runs `then` once (which may issue and wait for further collectives). Errors from either
// are kept and rethrown by every later wait(). How a reduction of several collectives in a row
// (a compressor's rounds, a compressed reduce-scatter) hands the caller one handle.
#pragma once

#include <exception>
#include <functional>
#include <mutex>
#include <vector>

#include "comm/communicator.h"

namespace krab::parallel {

// A Work that waits for `deps` in order, then runs `then` once (which may issue and wait for
// further collectives). Errors from either are kept and rethrown by every later wait().
class ThenWork : public comm::Work {
 public:
  ThenWork(std::vector<comm::WorkPtr> deps, std::function<void()> then)
      : deps_(std::move(deps)), then_(std::move(then)) {}
  void wait() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_) std::rethrow_exception(error_);
    if (done_) return;
    try {
      for (auto& d : deps_)
        if (d) d->wait();
      then_();
    } catch (...) {
      error_ = std::current_exception();
      done_ = true;
      throw;
    }
    done_ = true;
  }
  bool is_completed() override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }

 private:
  std::mutex mu_;
  std::vector<comm::WorkPtr> deps_;
  std::function<void()> then_;
  bool done_ = false;
  std::exception_ptr error_;
};

}  // namespace krab::parallel

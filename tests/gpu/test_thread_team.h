// One thread per rank for GPU tests: n worker threads on GPU 0, thread r creates rank r with
// ncclCommInitRank and runs the steps the test thread posts (CollThreadRanks, the fused
// matrix's thread-per-rank tests).
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>
#include <nccl.h>

namespace gputest {

constexpr double kStepTimeoutS = 60;  // per step of every worker (kernels give up after 20 s)

// n worker threads; thread r creates rank r with ncclCommInitRank and runs the steps posted
// by the test thread. Streams are created up front, consecutively, by the test thread: up to
// 8 of them then use distinct hardware queues (CUDA_DEVICE_MAX_CONNECTIONS).
class Team {
 public:
  using Step = std::function<std::string(int)>;
  explicit Team(int n) : n(n), comms(n, nullptr), streams(n, nullptr), errs_(n) {
    cudaSetDevice(0);
    for (auto& s : streams)
      if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
        why = "cudaStreamCreateWithFlags failed";
        return;
      }
    ncclUniqueId id;
    if (ncclGetUniqueId(&id) != ncclSuccess) {
      why = std::string("ncclGetUniqueId: ") + ncclGetLastError(nullptr);
      return;
    }
    for (int r = 0; r < n; r++) threads_.emplace_back([this, r, id] { worker(r, id); });
    why = collect(120);  // the init step
    ok = why.empty();
  }

  ~Team() {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (stuck_) {  // a worker never came back: leak it and its comm rather than hang
      for (auto& t : threads_) t.detach();
      return;
    }
    for (auto& t : threads_) t.join();
    for (ncclComm_t c : comms)  // after a failure (workers destroy their comms otherwise)
      if (c) ncclCommAbort(c);
    for (cudaStream_t s : streams)
      if (s) cudaStreamDestroy(s);
  }

  // Runs step(r) on every worker; "" or the failures. Bounded: a worker not back in time
  // gets its comm revoked (kernels and host waits end), then is given up on.
  std::string run(Step step, double timeoutS = kStepTimeoutS + 30) {
    if (!ok) return "team is broken: " + why;
    {
      std::lock_guard<std::mutex> g(mu_);
      step_ = std::move(step);
      done_ = 0;
      for (auto& e : errs_) e.clear();
      broken_ = false;
      barrierIn_ = 0;
      gen_++;
    }
    cv_.notify_all();
    std::string err = collect(timeoutS);
    if (!err.empty()) ok = false;
    return err;
  }

  // Inside a step: every worker meets here. False when a worker ended its step with an error
  // (it will not come) or the others did not come within timeoutS.
  bool barrier(double timeoutS = kStepTimeoutS) {
    std::unique_lock<std::mutex> lk(mu_);
    const uint64_t g = barrierGen_;
    if (++barrierIn_ == n) {
      barrierIn_ = 0;
      barrierGen_++;
      barrierCv_.notify_all();
      return !broken_;
    }
    barrierCv_.wait_for(lk, std::chrono::duration<double>(timeoutS),
                        [&] { return barrierGen_ != g || broken_; });
    return barrierGen_ != g && !broken_;
  }

  // Forget a comm the test aborted itself (the team then neither destroys nor aborts it).
  void forget(int r) { comms[r] = nullptr; }

  const int n;
  std::vector<ncclComm_t> comms;
  std::vector<cudaStream_t> streams;
  bool ok = false;
  std::string why;

 private:
  void worker(int r, ncclUniqueId id) {
    cudaSetDevice(0);
    ncclResult_t res = ncclCommInitRank(&comms[r], n, id, r);
    report(r, res == ncclSuccess ? ""
                                 : "rank " + std::to_string(r) + ": ncclCommInitRank: " +
                                       ncclGetErrorString(res) + ": " + ncclGetLastError(nullptr));
    uint64_t seen = 0;
    for (;;) {
      Step step;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || gen_ != seen; });
        if (stop_) break;
        seen = gen_;
        step = step_;
      }
      report(r, step(r));
    }
    std::lock_guard<std::mutex> g(mu_);
    if (!ok || comms[r] == nullptr) return;
    ncclCommDestroy(comms[r]);  // in its own thread, like the frameworks; frees it always
    comms[r] = nullptr;
  }

  void report(int r, std::string err) {
    {
      std::lock_guard<std::mutex> g(mu_);
      if (!err.empty()) broken_ = true;  // it will not come to a barrier of this step
      errs_[r] = std::move(err);
      done_++;
    }
    doneCv_.notify_all();
    barrierCv_.notify_all();
  }

  bool waitDone(double timeoutS) {
    std::unique_lock<std::mutex> lk(mu_);
    return doneCv_.wait_for(lk, std::chrono::duration<double>(timeoutS),
                            [&] { return done_ == n; });
  }

  std::string collect(double timeoutS) {
    std::string err;
    if (!waitDone(timeoutS)) {
      err = "workers not back after " + std::to_string((int)timeoutS) +
            " s (deadlock); revoking the comms. ";
      for (ncclComm_t c : comms)
        if (c) ncclCommRevoke(c, NCCL_REVOKE_DEFAULT);
      if (!waitDone(60)) {
        stuck_ = true;
        return err + "Workers still stuck after the revoke: leaking them";
      }
    }
    std::lock_guard<std::mutex> g(mu_);
    for (int r = 0; r < n; r++)
      if (!errs_[r].empty()) err += errs_[r] + "; ";
    return err;
  }

  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_, doneCv_, barrierCv_;
  Step step_;
  uint64_t gen_ = 0, barrierGen_ = 0;
  int done_ = 0, barrierIn_ = 0;
  bool stop_ = false, stuck_ = false, broken_ = false;
  std::vector<std::string> errs_;
};

}  // namespace gputest

// Two ranks as threads, one all_gather, checked: proves the installed headers and library work.
// Everything comes through <libcomm/libcomm.h> alone, as the README tells users; a libshard header
// proves shardcomm::shard's target carries the C++ standard its headers need.
#include <cstdio>
#include <thread>
#include <vector>

#include <libcomm/libcomm.h>
#ifndef CONSUMER_LIBCOMM_ONLY   // built so (C++17, pkg-config shardcomm-comm) it needs libcomm alone
#include <libshard/executor.h>  // C++20 (std::span, concepts): the target must ask for it
#endif

int main() {
  auto boots = libcomm::createInProcessBootstraps(2);
  int failures = 0;
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      auto comm = libcomm::Communicator::create(*boots[r]);
      if (!comm.isOk()) {
        fprintf(stderr, "rank %d: %s\n", r, comm.status().toString().c_str());
        ++failures;
        return;
      }
      auto stream = libcomm::createHostStream("consumer");
      float mine = static_cast<float>(r + 1);
      float all[2] = {0, 0};
      libcomm::Status st = comm.value()->allGather(&mine, all, 1, libcomm::DataType::kFloat32, *stream);
      if (st.isOk()) st = stream->synchronize(libcomm::Deadline::after(std::chrono::seconds(30)));
      if (!st.isOk() || all[0] != 1.0f || all[1] != 2.0f) {
        fprintf(stderr, "rank %d: %s, got %g %g\n", r, st.toString().c_str(), all[0], all[1]);
        ++failures;
      }
    });
  }
  for (auto& t : ranks) t.join();
  // The CUDA factories link in every build: a stream, or the reason there is none here.
  auto gpu = libcomm::createCudaStream("consumer-gpu");
  printf("consumer: CUDA %s: %s\n", libcomm::builtWithCuda() ? "built" : "not built",
         gpu.isOk() ? "stream made" : gpu.status().message().c_str());
  // launchLocal comes with the umbrella header too (the README points users at it); linked, not run
  // (it would start processes). A volatile pointer keeps the reference through the optimizer.
  libcomm::Status (*volatile launch)(const libcomm::LocalLaunchOptions&) = &libcomm::launchLocal;
  if (launch == nullptr) ++failures;
  printf("consumer: %s (libcomm %s)\n", failures ? "FAILED" : "ok", libcomm::versionString());
  return failures ? 1 : 0;
}

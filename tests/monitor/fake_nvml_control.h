// Opens the fake NVML library (tests/monitor/fake_nvml.cc) by path and exposes its controls. The
// code under test dlopen()s the same path and so shares the fake's state; holding this open also
// keeps that state alive across the Nvml objects of one test.
#pragma once

#include <dlfcn.h>

#include <string>

#include "gtest/gtest.h"

namespace trainerd::monitor {

class FakeNvmlControl {
 public:
  explicit FakeNvmlControl(const std::string& path = FAKE_NVML_PATH) {
    handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) {
      ADD_FAILURE() << "cannot open the fake NVML '" << path << "': " << dlerror();
      return;
    }
    Resolve("fake_nvml_reset", &reset_);
    Resolve("fake_nvml_set_init_result", &set_init_result_);
    Resolve("fake_nvml_set_utilization", &set_utilization_);
    Resolve("fake_nvml_set_sm_util", &set_sm_util_);
    Resolve("fake_nvml_initialized", &initialized_);
    Resolve("fake_nvml_gpm_metrics_calls", &gpm_metrics_calls_);
    reset_();
  }
  ~FakeNvmlControl() {
    if (handle_ != nullptr) dlclose(handle_);
  }
  FakeNvmlControl(const FakeNvmlControl&) = delete;
  FakeNvmlControl& operator=(const FakeNvmlControl&) = delete;

  void SetInitResult(int result) { set_init_result_(result); }
  void SetUtilization(unsigned int device, unsigned int percent) {
    set_utilization_(device, percent);
  }
  void SetSmUtil(unsigned int device, double percent) { set_sm_util_(device, percent); }
  // nvmlInit_v2 calls not yet matched by nvmlShutdown.
  int initialized() { return initialized_(); }
  int gpm_metrics_calls() { return gpm_metrics_calls_(); }

 private:
  template <typename Fn>
  void Resolve(const char* symbol, Fn* fn) {
    *fn = reinterpret_cast<Fn>(dlsym(handle_, symbol));
    ASSERT_NE(*fn, nullptr) << symbol;
  }

  void* handle_ = nullptr;
  void (*reset_)() = nullptr;
  void (*set_init_result_)(int) = nullptr;
  void (*set_utilization_)(unsigned int, unsigned int) = nullptr;
  void (*set_sm_util_)(unsigned int, double) = nullptr;
  int (*initialized_)() = nullptr;
  int (*gpm_metrics_calls_)() = nullptr;
};

}  // namespace trainerd::monitor

// The translation unit that owns the precompiled <torch/torch.h> (cmake/TrainerdTorch.cmake,
// trainerd_torch_pch); every other target that compiles with LibTorch reuses its header.

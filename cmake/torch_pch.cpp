// The target that makes the precompiled header of LibTorch's common headers
// (cmake/TorchUnityBuild.cmake) needs a source file of its own; this is it.

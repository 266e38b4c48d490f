#pragma once
// An RGBA texture for ImGui::Image, owned (deleted with its owner).
#include <cstddef>
#include <cstdint>

namespace nanscope::viewer {

class GlTexture {
 public:
  GlTexture() = default;
  GlTexture(const GlTexture&) = delete;
  GlTexture& operator=(const GlTexture&) = delete;
  ~GlTexture();
  // Uploads width x height pixels (IM_COL32 byte order), reallocating only on a size change.
  void upload(const uint32_t* rgba, size_t width, size_t height);
  void* id() const;  // for ImGui::Image; null before the first upload
  bool empty() const { return texture_ == 0; }

 private:
  unsigned texture_ = 0;
  size_t width_ = 0, height_ = 0;
};

}  // namespace nanscope::viewer

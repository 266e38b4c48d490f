#include "screenshot.hpp"

#include <GL/gl.h>
#include <stb/stb_image_write.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace nanscope::viewer {

std::string write_framebuffer_png(const std::string& path, int width, int height) {
  if (width <= 0 || height <= 0) return "the window has no pixels";
  std::vector<uint8_t> pixels(size_t(width) * height * 4);
  glPixelStorei(GL_PACK_ALIGNMENT, 1);
  glReadBuffer(GL_BACK);
  glReadPixels(0, 0, width, height, GL_RGBA, GL_UNSIGNED_BYTE, pixels.data());
  if (glGetError() != GL_NO_ERROR) return "glReadPixels failed";
  // OpenGL's rows run bottom-up, PNG's top-down; alpha is made opaque.
  std::vector<uint8_t> flipped(pixels.size());
  const size_t stride = size_t(width) * 4;
  for (int y = 0; y < height; ++y)
    std::memcpy(flipped.data() + size_t(y) * stride, pixels.data() + size_t(height - 1 - y) * stride, stride);
  for (size_t i = 3; i < flipped.size(); i += 4) flipped[i] = 255;
  if (!stbi_write_png(path.c_str(), width, height, 4, flipped.data(), int(stride)))
    return "cannot write '" + path + "'";
  return "";
}

}  // namespace nanscope::viewer

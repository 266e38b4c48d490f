#pragma once
// Writes the current OpenGL framebuffer as a PNG (stb_image_write).
#include <string>

namespace nanscope::viewer {

// Reads width x height pixels of the back buffer; returns an empty string on
// success, else why it failed.
std::string write_framebuffer_png(const std::string& path, int width, int height);

}  // namespace nanscope::viewer

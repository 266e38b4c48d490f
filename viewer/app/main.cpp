// nanscope-view: set-up, the frame loop, tear-down. Everything drawn lives in
// the panels; everything loaded lives in the ViewModel.
#include <GLFW/glfw3.h>
#include <backends/imgui_impl_glfw.h>
#include <backends/imgui_impl_opengl3.h>
#include <imgui.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cfloat>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "nanscope/common/cli_help.hpp"
#include "nanscope/common/exit_codes.hpp"
#include "nanscope/common/stats.hpp"
#include "panels.hpp"
#include "screenshot.hpp"

namespace {

using namespace nanscope::viewer;
using nanscope::median;

// Exit codes (nanscope/common/exit_codes.hpp): kExitOk shown (or screenshot
// written); kExitFailed no window, or the screenshot could not be written;
// kExitBadInput bad usage or an input that could not be opened.
using nanscope::kExitBadInput;
using nanscope::kExitFailed;
using nanscope::kExitOk;

struct ViewerOptions {
  std::vector<std::string> paths;
  std::string screenshot;
  int frames = 5;
  int width = 1600, height = 1000;
  std::string show = "auto";
  double poll_seconds = 0.5;
  size_t layer_window = 50;
};

std::string glfw_error;
void on_glfw_error(int, const char* description) { glfw_error = description; }

int run_viewer(const ViewerOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  auto ms_since_start = [&] {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  };
  ViewModel model;
  model.on_overview_build = [](const std::string& path, int64_t done, int64_t rows) {
    // A progress line on one terminal line, ended when done.
    std::fprintf(
        stderr,
        "\rnanscope-view: '%s' has no overview (written before format 1.12): built from its rows, %lld of %lld%s",
        path.c_str(), static_cast<long long>(done), static_cast<long long>(rows), done == rows ? "\n" : "");
  };
  model.open(options.paths);  // what fails is listed in the window and below
  const double open_ms = ms_since_start();
  for (const std::string& e : model.errors()) std::fprintf(stderr, "nanscope-view: %s\n", e.c_str());
  size_t errors_reported = model.errors().size();

  glfwSetErrorCallback(on_glfw_error);
  if (!glfwInit()) {
    std::fprintf(stderr, "nanscope-view: cannot open a window (%s); without a display, run under xvfb-run\n",
                 glfw_error.c_str());
    return kExitFailed;
  }
  glfwWindowHint(GLFW_CONTEXT_VERSION_MAJOR, 3);
  glfwWindowHint(GLFW_CONTEXT_VERSION_MINOR, 0);
  const std::string title = "nanscope-view: " + (options.paths.empty() ? std::string() : options.paths.front());
  GLFWwindow* window = glfwCreateWindow(options.width, options.height, title.c_str(), nullptr, nullptr);
  if (!window) {
    std::fprintf(stderr, "nanscope-view: cannot create an OpenGL 3 window (%s)\n", glfw_error.c_str());
    glfwTerminate();
    return kExitFailed;
  }
  glfwMakeContextCurrent(window);
  glfwSwapInterval(options.screenshot.empty() ? 1 : 0);

  IMGUI_CHECKVERSION();
  ImGui::CreateContext();
  ImGui::GetIO().IniFilename = nullptr;  // the layout is fixed; nothing to save
  ImGui::StyleColorsDark();
  ImGui_ImplGlfw_InitForOpenGL(window, true);
  ImGui_ImplOpenGL3_Init("#version 130");

  bool screenshot_failed = false;
  {
    UiState ui;  // owns GL textures: destroyed while the context is alive
    ui.layer_window = options.layer_window;
    ui.active_run = int(model.first_run_to_show());
    const bool only_snapshots = model.runs.empty() && !model.snapshots.empty();
    ui.tab = options.show == "snapshot" || (options.show == "auto" && only_snapshots) ? Tab::snapshot : Tab::training;
    std::vector<double> build_ms;
    double first_frame_ms = 0;
    build_ms.reserve(size_t(std::max(0, options.frames)));
    auto last_poll = std::chrono::steady_clock::now();
    for (int frame = 0; !glfwWindowShouldClose(window); ++frame) {
      if (options.screenshot.empty())
        glfwWaitEventsTimeout(options.poll_seconds * 0.5);  // idle without spinning; wake for live rows
      else
        glfwPollEvents();
      const auto now = std::chrono::steady_clock::now();
      if (std::chrono::duration<double>(now - last_poll).count() >= options.poll_seconds) {
        model.poll();
        last_poll = now;
        for (; errors_reported < model.errors().size(); ++errors_reported)
          std::fprintf(stderr, "nanscope-view: %s\n", model.errors()[errors_reported].c_str());
      }

      const bool last_frame = !options.screenshot.empty() && frame + 1 >= options.frames;
      if (last_frame) ui.regions.clear();  // report only what the screenshot shows
      const auto build_start = std::chrono::steady_clock::now();
      ImGui_ImplOpenGL3_NewFrame();
      ImGui_ImplGlfw_NewFrame();
      // A screenshot shows the data, not a tooltip wherever Xvfb's pointer sits.
      if (!options.screenshot.empty()) ImGui::GetIO().MousePos = {-FLT_MAX, -FLT_MAX};
      ImGui::NewFrame();
      draw_frame(model, ui);
      model.focus(ui.steps.x, ui.heatmap_columns);  // a long run's zoomed-in rows, fetched behind the frames
      ImGui::Render();
      build_ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - build_start).count());

      int fb_width = 0, fb_height = 0;
      glfwGetFramebufferSize(window, &fb_width, &fb_height);
      glViewport(0, 0, fb_width, fb_height);
      glClearColor(0.08f, 0.08f, 0.09f, 1.0f);
      glClear(GL_COLOR_BUFFER_BIT);
      ImGui_ImplOpenGL3_RenderDrawData(ImGui::GetDrawData());
      if (frame == 0) {
        glFinish();
        first_frame_ms = ms_since_start();
      }

      if (last_frame) {
        glFinish();
        const std::string error = write_framebuffer_png(options.screenshot, fb_width, fb_height);
        if (!error.empty()) {
          std::fprintf(stderr, "nanscope-view: screenshot failed: %s\n", error.c_str());
          screenshot_failed = true;
        } else {
          std::printf("screenshot %s (%dx%d) after %d frames; frame build median %.2f ms\n", options.screenshot.c_str(),
                      fb_width, fb_height, frame + 1, median(build_ms));
          std::printf("opened in %.0f ms; first frame drawn %.0f ms after start\n", open_ms, first_frame_ms);
          // Where each plot was drawn, for tests that check the pixels.
          for (const auto& [name, r] : ui.regions)
            std::printf("region %s %.0f %.0f %.0f %.0f\n", name.c_str(), r.x, r.y, r.w, r.h);
        }
        break;
      }
      glfwSwapBuffers(window);
    }
  }
  ImGui_ImplOpenGL3_Shutdown();
  ImGui_ImplGlfw_Shutdown();
  ImGui::DestroyContext();
  glfwDestroyWindow(window);
  glfwTerminate();
  if (screenshot_failed) return kExitFailed;
  return model.errors().empty() ? kExitOk : kExitBadInput;
}

}  // namespace

int main(int argc, char** argv) {
  ViewerOptions options;
  CLI::App app{
      "nanscope-view: plots training runs (loss, loss scale, LR, grad norms, a layer x step heatmap,\n"
      "events) and snapshots (first NaN/Inf births, the ops before them, replay's verdict).\n"
      "Runs still being written are followed live.\n"
      "Mouse: wheel zooms steps, shift+wheel zooms y, drag pans, double-click fits; click a heatmap\n"
      "row or a table row to plot that layer.\n"
      "Exit codes: 0 ok, 1 no window or screenshot not written, 2 bad usage or an input not opened.",
      "nanscope-view"};
  nanscope::use_nanscope_help(app);
  app.add_option("paths", options.paths, "run directories (run.h5 + snapshots/), run.h5 files, snapshots")->required();
  app.add_option("--screenshot", options.screenshot,
                 "render --frames frames, write the window as this PNG and exit (use xvfb-run without a display)");
  app.add_option("--frames", options.frames, "frames to render before --screenshot")->check(CLI::Range(1, 100000));
  app.add_option("--width", options.width, "window width")->check(CLI::Range(320, 8192));
  app.add_option("--height", options.height, "window height")->check(CLI::Range(240, 8192));
  app.add_option("--show", options.show, "the tab to open: training, snapshot, or auto")
      ->check(CLI::IsMember({"auto", "training", "snapshot"}));
  app.add_option("--poll", options.poll_seconds, "seconds between checks for new rows of a live run")
      ->check(CLI::Range(0.01, 3600.0));
  app.add_option("--growth-window", options.layer_window, "K: the layer table's growth is over the last K steps")
      ->check(CLI::Range(2, 1000000));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? kExitOk : kExitBadInput;
  }
  try {
    return run_viewer(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nanscope-view: %s\n", e.what());
    return kExitFailed;
  }
}

// The viewer's model without a window: decimation, the heatmap pyramid and
// image, axes, the layer table.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "nanscope/viewer/axes.hpp"
#include "nanscope/viewer/decimate.hpp"
#include "nanscope/viewer/heatmap.hpp"
#include "nanscope/viewer/layer_pyramid.hpp"
#include "nanscope/viewer/layer_table.hpp"

using namespace nanscope::viewer;

namespace {

constexpr double kNaNValue = std::numeric_limits<double>::quiet_NaN();
constexpr double kInfValue = std::numeric_limits<double>::infinity();

std::vector<int64_t> steps_from(int64_t first, size_t n) {
  std::vector<int64_t> steps(n);
  for (size_t i = 0; i < n; ++i) steps[i] = first + int64_t(i);
  return steps;
}

}  // namespace

TEST(Decimate, KeepsTheTrueMinAndMaxOfEveryColumn) {
  std::mt19937 rng(7);
  std::normal_distribution<double> noise;
  const size_t n = 10007;
  std::vector<double> values(n);
  for (double& v : values) v = noise(rng);
  const auto steps = steps_from(100, n);
  std::vector<Column> columns;
  const double x0 = 1234.5, x1 = 9876.0;
  const size_t width = 37;
  decimate(steps.data(), series(values), x0, x1, width, columns);
  ASSERT_EQ(columns.size(), width);
  // Brute force: which column each visible point falls in.
  std::vector<double> lo(width, kInfValue), hi(width, -kInfValue);
  std::vector<int> count(width, 0);
  for (size_t i = 0; i < n; ++i) {
    const double x = double(steps[i]);
    if (x < x0 || x >= x1) continue;
    const size_t c = std::min(width - 1, size_t((x - x0) / (x1 - x0) * width));
    lo[c] = std::min(lo[c], values[i]);
    hi[c] = std::max(hi[c], values[i]);
    ++count[c];
  }
  for (size_t c = 0; c < width; ++c) {
    EXPECT_EQ(columns[c].count, count[c]) << c;
    EXPECT_DOUBLE_EQ(columns[c].min, lo[c]) << c;
    EXPECT_DOUBLE_EQ(columns[c].max, hi[c]) << c;
  }
}

TEST(Decimate, NeverDropsANonFiniteValueAtAnyZoom) {
  const size_t n = 100000;
  std::vector<double> values(n, 1.0);
  values[4321] = kNaNValue;
  values[77777] = kInfValue;
  values[99999] = -kInfValue;
  const auto steps = steps_from(0, n);
  for (size_t width : {size_t(7), size_t(100), size_t(1920), size_t(100000)}) {
    std::vector<Column> columns;
    decimate(steps.data(), series(values), 0, double(n), width, columns);
    uint8_t seen = 0;
    int marked = 0;
    for (const Column& c : columns) {
      seen |= c.nonfinite;
      marked += c.nonfinite != 0;
    }
    EXPECT_EQ(seen, NonFinite::kNaN | kPosInf | kNegInf) << width;
    EXPECT_LE(marked, 3) << width;
    const auto column_of = [&](size_t i) { return std::min(width - 1, size_t(double(i) / n * width)); };
    EXPECT_TRUE(columns[column_of(4321)].nonfinite & NonFinite::kNaN) << width;
    EXPECT_TRUE(columns[column_of(77777)].nonfinite & kPosInf) << width;
  }
}

TEST(Decimate, NaNAsMissingAndLogAxisSkipValuesWithoutMarking) {
  const std::vector<double> values = {kNaNValue, 2.0, 0.0, -1.0, kNaNValue, 8.0};
  const auto steps = steps_from(0, values.size());
  std::vector<Column> columns;
  decimate(steps.data(), series(values), 0, 6, 1, columns, {/*nan_is_missing=*/true, /*log_y=*/true});
  EXPECT_EQ(columns[0].nonfinite, 0);
  EXPECT_EQ(columns[0].count, 2);
  EXPECT_DOUBLE_EQ(columns[0].min, 2.0);
  EXPECT_DOUBLE_EQ(columns[0].max, 8.0);
}

TEST(Decimate, ReadsOneLayerOutOfAStepByLayerTable) {
  const std::vector<float> table = {1, 10, 2, 20, 3, 30};  // 3 steps x 2 layers
  const auto steps = steps_from(0, 3);
  std::vector<Column> columns;
  decimate(steps.data(), layer_series(table, 2, 1), 0, 3, 3, columns);
  EXPECT_DOUBLE_EQ(columns[0].max, 10);
  EXPECT_DOUBLE_EQ(columns[2].max, 30);
}

TEST(LayerPyramid, MaxOverNeverMissesAPeakOrANaN) {
  const size_t rows = 1000, layers = 7;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> uniform(0.1f, 1.0f);
  std::vector<float> table(rows * layers);
  for (float& v : table) v = uniform(rng);
  table[613 * layers + 3] = NAN;
  table[10 * layers + 5] = INFINITY;
  LayerPyramid pyramid(false);
  pyramid.update(table, rows, layers);
  std::uniform_int_distribution<size_t> pick(0, rows - 1);
  for (int trial = 0; trial < 2000; ++trial) {
    size_t a = pick(rng), b = pick(rng);
    if (a > b) std::swap(a, b);
    ++b;
    const double rpp = double(1 + pick(rng) % 300);
    const size_t layer = trial % layers;
    float exact = -1;
    bool nan = false;
    for (size_t r = a; r < b; ++r) {
      const float v = table[r * layers + layer];
      nan |= std::isnan(v);
      if (!std::isnan(v)) exact = std::max(exact, v);
    }
    const float got = pyramid.max_over(layer, a, b, rpp);
    if (nan) {
      EXPECT_TRUE(std::isnan(got)) << a << "-" << b << " rpp " << rpp;
    } else if (!std::isnan(got)) {
      EXPECT_GE(got, exact) << a << "-" << b << " rpp " << rpp;  // may reach into a neighbour, never less
    }
  }
  EXPECT_NEAR(pyramid.finite_max(), 1.0, 1e-3);
  EXPECT_GT(pyramid.levels(), 9u);
}

TEST(LayerPyramid, AppendingRowsGivesTheSameLevelsAsBuildingAtOnce) {
  const size_t layers = 3;
  std::vector<float> table;
  LayerPyramid grown(true);
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> uniform(0.0f, 5.0f);
  for (size_t chunk : {1, 5, 16, 3, 64, 7, 200}) {
    for (size_t i = 0; i < chunk * layers; ++i) table.push_back(i % 5 == 0 ? NAN : uniform(rng));
    grown.update(table, table.size() / layers, layers);
  }
  LayerPyramid built(true);
  built.update(table, table.size() / layers, layers);
  ASSERT_EQ(grown.levels(), built.levels());
  const size_t rows = table.size() / layers;
  for (double rpp : {1.0, 2.0, 8.0, 64.0, 1000.0})
    for (size_t a = 0; a < rows; a += 13)
      for (size_t l = 0; l < layers; ++l) {
        const float x = grown.max_over(l, a, std::min(rows, a + 40), rpp);
        const float y = built.max_over(l, a, std::min(rows, a + 40), rpp);
        EXPECT_TRUE(x == y || (std::isnan(x) && std::isnan(y))) << a << " " << l << " " << rpp;
      }
}

TEST(Heatmap, EachPixelShowsItsLayersLargestValueAndNonFiniteColours) {
  const size_t rows = 8, layers = 2;
  // layer 0: 1..8; layer 1: 1 except a NaN at step 5 and an Inf at step 2
  std::vector<float> table;
  for (size_t r = 0; r < rows; ++r) {
    table.push_back(float(r + 1));
    table.push_back(r == 5 ? NAN : r == 2 ? INFINITY : 1.0f);
  }
  LayerPyramid pyramid(false);
  pyramid.update(table, rows, layers);
  const auto steps = steps_from(0, rows);
  HeatmapImage image;
  const LogScale scale{1, 8};
  render_heatmap(rows_grid(pyramid, steps.data()), 0, 8, 4, scale, image);  // 2 steps per pixel
  ASSERT_EQ(image.columns, 4u);
  ASSERT_EQ(image.rows, 2u);
  EXPECT_FLOAT_EQ(image.at(0, 0), 2);
  EXPECT_FLOAT_EQ(image.at(0, 3), 8);
  EXPECT_EQ(image.rgba[0 * 4 + 3], colormap(1.0f));
  EXPECT_EQ(image.rgba[1 * 4 + 1], kInfColor);  // steps 2-3
  EXPECT_EQ(image.rgba[1 * 4 + 2], kNaNColor);  // steps 4-5
  EXPECT_EQ(image.rgba[1 * 4 + 0], colormap(0.0f));
  // Zoomed in past one step per pixel: every pixel is filled, none left empty.
  render_heatmap(rows_grid(pyramid, steps.data()), 2, 4, 40, scale, image);
  for (size_t c = 0; c < 40; ++c) EXPECT_NE(image.rgba[c], kMissingColor) << c;
}

TEST(Axes, ZoomKeepsTheAnchorAndClampStaysInsideTheData) {
  const AxisRange z = zoomed({0, 100}, 25, 0.5);
  EXPECT_DOUBLE_EQ(z.lo, 12.5);
  EXPECT_DOUBLE_EQ(z.hi, 62.5);
  const AxisRange c = clamped({-50, 10}, {0, 1000}, 4);
  EXPECT_DOUBLE_EQ(c.lo, 0);
  EXPECT_DOUBLE_EQ(c.hi, 60);
  const AxisRange tiny = clamped({10, 10.5}, {0, 1000}, 4);
  EXPECT_DOUBLE_EQ(tiny.span(), 4);
}

TEST(Axes, TicksFallOnOneTwoFiveAndOnDecades) {
  std::vector<double> ticks;
  linear_ticks({0, 1000}, 5, ticks);
  EXPECT_EQ(ticks, (std::vector<double>{0, 200, 400, 600, 800, 1000}));
  linear_ticks({0.00013, 0.00047}, 4, ticks);
  ASSERT_FALSE(ticks.empty());
  EXPECT_NEAR(ticks.front(), 0.0002, 1e-12);
  log_ticks({-3.5, 4.2}, 10, ticks);
  EXPECT_EQ(ticks, (std::vector<double>{-3, -2, -1, 0, 1, 2, 3, 4}));
  log_ticks({-0.5, 0.9}, 10, ticks);  // under two decades: 1, 2, 5
  ASSERT_EQ(ticks.size(), 4u);
  EXPECT_NEAR(ticks[0], std::log10(0.5), 1e-12);
  EXPECT_NEAR(ticks[3], std::log10(5.0), 1e-12);
  char text[32];
  format_value(kNaNValue, text, sizeof text);
  EXPECT_STREQ(text, "nan");
  format_value(65504, text, sizeof text);
  EXPECT_STREQ(text, "6.55e+04");
}

TEST(LayerTable, SortsByNormAndByGrowthWithANaNLayerFirst) {
  nanscope::format::RunData run;
  run.layer_names = {"a", "b", "c"};
  // 4 steps; a grows x4, b is flat and large, c goes NaN at the last step
  const float norms[4][3] = {{1, 5, 1}, {2, 5, 1}, {3, 5, 1}, {4, 5, NAN}};
  for (int s = 0; s < 4; ++s) {
    run.step.push_back(s);
    for (float v : norms[s]) run.layer_grad_norm.push_back(v);
    for (int l = 0; l < 3; ++l) run.layer_act_absmax.push_back(s == 1 ? 100.0f * (l + 1) : NAN);
  }
  run.loss.assign(4, 1.0);
  std::vector<LayerRow> rows;
  layer_rows(run, 4, rows);
  EXPECT_DOUBLE_EQ(rows[0].growth, 4.0);
  EXPECT_TRUE(rows[2].nonfinite);
  EXPECT_DOUBLE_EQ(rows[2].act_absmax, 300.0);
  EXPECT_NEAR(rows[2].fp16_headroom_bits(), std::log2(65504.0 / 300.0), 1e-9);
  sort_layer_rows(rows, run, LayerSort::norm, true);
  EXPECT_EQ(rows[0].layer, 2u);  // NaN first
  EXPECT_EQ(rows[1].layer, 1u);
  sort_layer_rows(rows, run, LayerSort::growth, true);
  EXPECT_EQ(rows[0].layer, 2u);
  EXPECT_EQ(rows[1].layer, 0u);  // x4 before flat
  layer_rows(run, 2, rows);      // the last 2 steps only: a grows 3 -> 4
  EXPECT_NEAR(rows[0].growth, 4.0 / 3.0, 1e-12);
}

TEST(Colormap, TheHeatmapsFastColoursMatchTheExactOnes) {
  const LogScale scale{1e-4, 1e2};
  const HeatColorizer fast(scale, /*nan_is_missing=*/false);
  auto channel_gap = [](uint32_t a, uint32_t b) {
    int worst = 0;
    for (int shift : {0, 8, 16}) worst = std::max(worst, std::abs(int(a >> shift & 255) - int(b >> shift & 255)));
    return worst;
  };
  for (double v = 1e-5; v < 1e3; v *= 1.07)
    EXPECT_LE(channel_gap(fast(float(v)), heat_color(float(v), scale, false)), 4) << v;
  EXPECT_EQ(fast(NAN), kNaNColor);
  EXPECT_EQ(fast(INFINITY), kInfColor);
  EXPECT_EQ(HeatColorizer(scale, true)(NAN), kMissingColor);
}

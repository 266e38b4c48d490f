#include "json_report.hpp"

#include <map>

#include "json_writer.hpp"
#include "nanscope/format/advice_words.hpp"
#include "nanscope/format/capture.hpp"
#include "nanscope/format/precision_trail.hpp"

namespace nanscope::report {

namespace {

void write_step_value(JsonWriter& json, const std::optional<StepValue>& v) {
  if (!v) return json.null();
  json.begin_object();
  json.key("step").value(v->step);
  json.key("loss").value(v->value);
  json.end_object();
}

void write_summary(JsonWriter& json, const RunSummary& s) {
  json.begin_object();
  json.key("rows").value(s.rows);
  json.key("first_step").value(s.first_step);
  json.key("last_step").value(s.last_step);
  json.key("counted").value(s.counted);
  json.key("skipped").value(s.skipped);
  json.key("rolled_back").value(s.rolled_back);
  json.key("final_loss");
  write_step_value(json, s.final_loss);
  json.key("last_finite_loss");
  write_step_value(json, s.last_finite_loss);
  json.key("amp").begin_array();
  for (const AmpSpan& span : s.amp) {
    json.begin_object();
    json.key("precision").value(format::to_string(span.precision));
    json.key("first_step").value(span.first_step);
    json.key("last_step").value(span.last_step);
    json.end_object();
  }
  json.end_array();
  json.key("fp32_from_step").value(s.fp32_from_step);
  json.key("loss_scale");
  if (s.loss_scale_min) {
    json.begin_object();
    json.key("min").value(*s.loss_scale_min);
    json.key("max").value(*s.loss_scale_max);
    json.end_object();
  } else {
    json.null();
  }
  json.end_object();
}

void write_events(JsonWriter& json, const format::RunData& run) {
  // Every kind, seen or not, so a reader can index any of them.
  std::map<std::string, int64_t> counts;
  for (size_t k = 0; k <= format::Words<format::EventKind>::count; ++k)
    counts[format::to_string(static_cast<format::EventKind>(k))] = 0;
  for (const format::RunEvent& e : run.events) ++counts[format::to_string(e.kind)];
  json.key("event_counts").begin_object();
  for (const auto& [kind, count] : counts) json.key(kind).value(count);
  json.end_object();

  json.key("events").begin_array();
  for (const format::RunEvent& e : run.events) {
    json.begin_object();
    json.key("step").value(e.step);
    json.key("kind").value(format::to_string(e.kind));
    json.key("text").value(e.text);
    json.end_object();
  }
  json.end_array();

  json.key("rollbacks").begin_array();
  for (const format::RunEvent& e : run.events) {
    if (e.kind != format::EventKind::rollback) continue;
    const std::optional<RollbackSpan> span = rollback_span(run, e);
    json.begin_object();
    json.key("step").value(e.step);
    json.key("to_step").value(span ? std::optional<int64_t>(span->to_step) : std::nullopt);
    json.key("rows_taken_back").value(span ? std::optional<size_t>(span->rows_taken_back) : std::nullopt);
    json.key("text").value(e.text);
    json.end_object();
  }
  json.end_array();
}

void write_birth(JsonWriter& json, const std::optional<format::Birth>& birth) {
  if (!birth) return json.null();
  json.begin_object();
  json.key("text").value(format::birth_text(*birth));
  json.key("kind").value(format::to_string(birth->kind));
  json.key("op").value(birth->op.op);
  json.key("phase").value(format::to_string(birth->op.phase));
  json.key("module").value(birth->op.module);
  json.key("sample").value(birth->sample >= 0 ? std::optional<int64_t>(birth->sample) : std::nullopt);
  json.key("micro_batch").value(birth->micro_batch >= 0 ? std::optional<int64_t>(birth->micro_batch) : std::nullopt);
  json.key("rows").begin_array();
  for (int64_t row : birth->rows) json.value(row);
  json.end_array();
  json.end_object();
}

void write_snapshot(JsonWriter& json, const SnapshotEntry& entry) {
  json.begin_object();
  json.key("path").value(entry.path);
  json.key("readable").value(entry.summary.has_value());
  if (!entry.summary) {
    json.key("error").value(entry.error);
    return json.end_object();
  }
  const format::SnapshotSummary& s = *entry.summary;
  json.key("step").value(s.step);
  json.key("precision").value(format::to_string(s.precision));
  json.key("loss_scale").value(s.loss_scale);
  json.key("lr").value(s.lr);
  json.key("model").value(s.model_name);
  json.key("origin").value(format::to_string(s.origin));
  json.key("replay_command").value(format::replay_command(s, entry.path));
  json.key("reproduced").value(s.capture.reproduced);
  json.key("capture").value(format::capture_text(s.capture));
  json.key("first_birth");
  write_birth(json, s.capture.first_birth);
  json.key("first_nan_birth");
  write_birth(json, s.capture.first_nan_birth);
  json.key("first_inf_birth");
  write_birth(json, s.capture.first_inf_birth);
  json.key("batch_rows").begin_array();
  for (int64_t row : s.batch_rows) json.value(row);
  json.end_array();
  // The first birth's batch rows with their data-set rows (null: unknown).
  json.key("nonfinite_rows").begin_array();
  for (const BirthRow& row : birth_rows(s)) {
    json.begin_object();
    json.key("batch_row").value(row.batch_row);
    json.key("dataset_row").value(row.dataset_row);
    json.end_object();
  }
  json.end_array();
  json.key("replay");
  if (s.replay) {
    json.begin_object();
    json.key("verdict").value(format::to_string(s.replay->verdict));
    json.key("category").value(format::to_string(s.replay->category));
    json.key("suggestion").value(s.replay->suggestion);
    json.key("reproduced_count").value(s.replay->reproduced_count);
    json.key("repeats").value(s.replay->repeats);
    json.key("fp32_finite").value(s.replay->fp32_finite);
    json.key("samples").value(s.replay->samples);
    json.key("fp32_modules").value(s.replay->fp32_modules);
    json.key("widened_weights");
    if (s.replay->widened_weights.empty())
      json.null();
    else
      json.value(s.replay->widened_weights);
    // The born op's other kernels, as the replay tried them.
    json.key("kernels");
    if (const std::optional<format::KernelTrials>& k = s.replay->kernel_trials) {
      json.begin_object();
      json.key("op").value(k->op);
      json.key("used").value(format::to_string(k->used));
      json.key("text").value(format::kernel_trials_text(*k));
      json.key("tried");
      json.begin_object();
      for (const format::KernelTrial& t : k->tried)
        json.key(format::to_string(t.kernel)).value(format::to_string(t.outcome));
      json.end_object();
      json.end_object();
    } else {
      json.null();
    }
    // Where precision was lost: the first op of the trail past its margin (the
    // whole trail is nanscope-replay --json's).
    json.key("precision_lost");
    const std::optional<format::PrecisionTrail>& trail = s.replay->precision_trail;
    if (trail) {
      json.begin_object();
      json.key("text").value(format::precision_lost_text(*trail));
      json.key("type").value(trail->type);
      json.key("ops_compared").value(trail->ops.size());
      json.key("op");
      if (trail->first_lost >= 0) {
        const format::OpError& e = trail->ops[size_t(trail->first_lost)];
        json.begin_object();
        json.key("index").value(e.op.index);
        json.key("op").value(e.op.op);
        json.key("phase").value(format::to_string(e.op.phase));
        json.key("module").value(e.op.module);
        json.key("ulps").value(e.ulps);
        json.key("max_abs").value(e.max_abs);
        json.key("max_rel").value(e.max_rel);
        json.end_object();
      } else {
        json.null();
      }
      json.end_object();
    } else {
      json.null();
    }
    json.end_object();
  } else {
    json.null();
  }
  json.end_object();
}

void write_rank(JsonWriter& json, const RankReport& r) {
  json.begin_object();
  json.key("rank").value(r.file.rank >= 0 ? std::optional<int64_t>(r.file.rank) : std::nullopt);
  json.key("path").value(r.file.path);
  if (!r.run) {
    json.key("error").value(r.error);
    return json.end_object();
  }
  json.key("error").null();
  const format::RunData& run = *r.run;
  json.key("format_version").value(run.format_version);
  json.key("origin").value(format::to_string(run.origin));
  json.key("writer_open").value(r.writer_open);
  json.key("config").begin_object();
  for (const auto& [key, value] : run.config) json.key(key).value(value);
  json.end_object();
  json.key("summary");
  write_summary(json, r.summary);
  write_events(json, run);
  json.key("snapshots").begin_array();
  for (const SnapshotEntry& entry : r.snapshots) write_snapshot(json, entry);
  json.end_array();
  json.end_object();
}

}  // namespace

void write_json(const RunReport& report, std::ostream& out) {
  JsonWriter json(out);
  json.begin_object();
  json.key("input").value(report.input);
  json.key("runs").begin_array();
  for (const RankReport& r : report.ranks) write_rank(json, r);
  json.end_array();
  json.key("left_out").begin_object();
  json.key("path").value(report.left_out.path);
  json.key("error").value(report.left_out.error.empty() ? std::optional<std::string>() : report.left_out.error);
  json.key("samples").begin_array();
  for (const format::PoisonedSample& s : report.left_out.samples) {
    json.begin_object();
    json.key("row").value(s.row);
    json.key("step").value(s.step);
    json.key("rank").value(s.rank);
    json.key("birth").value(s.birth);
    json.key("why").value(s.why);
    json.end_object();
  }
  json.end_array();
  json.end_object();
  json.end_object();
  json.finish();
}

}  // namespace nanscope::report

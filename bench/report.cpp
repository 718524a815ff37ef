#include "report.hpp"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <tapegrad/tapegrad.hpp>

namespace bench {
namespace {

double seconds(const std::function<void()>& f, int batch) {
  const auto t0 = clock_type::now();
  for (int i = 0; i < batch; ++i) f();
  return since(t0) / batch;
}

nlohmann::json to_json(const Cell& c) {
  if (std::holds_alternative<std::monostate>(c)) return nullptr;
  if (const auto* s = std::get_if<Stats>(&c))
    return {{"median_ms", s->median * 1e3}, {"min_ms", s->min * 1e3}, {"max_ms", s->max * 1e3}, {"runs", s->runs}};
  if (const auto* s = std::get_if<std::string>(&c)) return *s;
  if (const auto* i = std::get_if<std::int64_t>(&c)) return *i;
  return std::get<double>(c);
}

std::string render(const Cell& c, const Column& col) {
  if (std::holds_alternative<std::monostate>(c)) return "-";
  if (const auto* s = std::get_if<std::string>(&c)) return *s;
  if (const auto* i = std::get_if<std::int64_t>(&c)) return fmt::format("{}", *i);
  if (const auto* s = std::get_if<Stats>(&c)) {
    const double k = col.microseconds ? 1e6 : 1e3;
    return fmt::format("{:.{}f} ({:.{}f}-{:.{}f})", s->median * k, col.precision, s->min * k, col.precision, s->max * k, col.precision);
  }
  if (col.precision < 0) return fmt::format("{:.{}e}", std::get<double>(c), -col.precision);
  return fmt::format("{:.{}f}", std::get<double>(c), col.precision);
}

}  // namespace

Stats stats_of(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  const std::size_t n = samples.size();
  const double median = n % 2 ? samples[n / 2] : (samples[n / 2 - 1] + samples[n / 2]) / 2;
  return {median, samples.front(), samples.back(), static_cast<int>(n)};
}

std::vector<Stats> measure(const std::vector<std::function<void()>>& fs, int min_runs, double min_seconds) {
  std::vector<int> batch(fs.size(), 1);
  for (std::size_t i = 0; i < fs.size(); ++i) {
    const double first = seconds(fs[i], 1);  // warm-up: primitives, caches, pages
    const double again = seconds(fs[i], 1);
    const double t = std::min(first, again);
    if (t < 50e-6) batch[i] = static_cast<int>(std::min(1000.0, 50e-6 / std::max(t, 1e-9)));
  }
  std::vector<std::vector<double>> samples(fs.size());
  const auto start = clock_type::now();
  for (int round = 0;; ++round) {
    const double elapsed = since(start);
    if (round >= min_runs && elapsed >= min_seconds) break;
    if (round >= 10 * min_runs && elapsed >= min_seconds / 10) break;  // many fast rounds are enough
    for (std::size_t i = 0; i < fs.size(); ++i) samples[i].push_back(seconds(fs[i], batch[i]));
  }
  std::vector<Stats> out;
  for (auto& s : samples) out.push_back(stats_of(std::move(s)));
  return out;
}

Stats measure(const std::function<void()>& f, int min_runs, double min_seconds) {
  return measure(std::vector<std::function<void()>>{f}, min_runs, min_seconds)[0];
}

Table::Table(std::string section, std::string id, std::string title, std::vector<Column> columns)
    : section_(std::move(section)), id_(std::move(id)), title_(std::move(title)), columns_(std::move(columns)) {
  std::string header;
  for (const auto& c : columns_) header += fmt::format("{:>{}} ", c.header, c.width);
  fmt::print("\n{}\n{}\n", title_, header);
  std::fflush(stdout);
}

void Table::add(std::vector<Cell> row) {
  if (row.size() != columns_.size())
    throw std::logic_error(fmt::format("table {}: row of {} cells for {} columns", id_, row.size(), columns_.size()));
  std::string line;
  for (std::size_t i = 0; i < row.size(); ++i) line += fmt::format("{:>{}} ", render(row[i], columns_[i]), columns_[i].width);
  fmt::print("{}\n", line);
  std::fflush(stdout);
  rows_.push_back(std::move(row));
}

void Table::note(std::string text) {
  fmt::print("  {}\n", text);
  notes_.push_back(std::move(text));
}

std::string Table::markdown() const {
  auto escaped = [](std::string s) {
    for (std::size_t at = s.find('|'); at != std::string::npos; at = s.find('|', at + 2)) s.replace(at, 1, "\\|");
    return s;
  };
  std::string out = fmt::format("**{}**\n\n|", escaped(title_));
  for (const auto& c : columns_) out += fmt::format(" {} |", escaped(c.header));
  out += "\n|";
  for (std::size_t i = 0; i < columns_.size(); ++i) out += i == 0 ? " --- |" : " ---: |";
  for (const auto& r : rows_) {
    out += "\n|";
    for (std::size_t i = 0; i < r.size(); ++i) out += fmt::format(" {} |", escaped(render(r[i], columns_[i])));
  }
  out += "\n";
  for (const auto& n : notes_) out += fmt::format("\n- {}", escaped(n));
  return out + (notes_.empty() ? "" : "\n");
}

std::string Table::json() const {
  nlohmann::json t{{"section", section_}, {"title", title_}, {"notes", notes_}};
  t["columns"] = nlohmann::json::array();
  for (const auto& c : columns_) t["columns"].push_back({{"key", c.key}, {"header", c.header}});
  t["rows"] = nlohmann::json::array();
  for (const auto& r : rows_) {
    nlohmann::json row = nlohmann::json::object();
    for (std::size_t i = 0; i < r.size(); ++i) row[columns_[i].key] = to_json(r[i]);
    t["rows"].push_back(row);
  }
  return t.dump();
}

void Report::fact(const std::string& key, const std::string& label, const Cell& value, const std::string& unit) {
  const Column plain{key, label, 2, 0};
  fmt::print("{}: {}{}{}\n", label, render(value, plain), unit.empty() ? "" : " ", unit);
  std::fflush(stdout);
  facts_.emplace_back(key, value);
  fact_labels_.push_back(label);
  fact_units_.push_back(unit);
}

Table& Report::table(std::string id, std::string title, std::vector<Column> columns) {
  for (const auto& t : tables_)
    if (t->id() == id) throw std::logic_error(fmt::format("table id {} used twice", id));
  tables_.push_back(std::make_unique<Table>(section_, std::move(id), std::move(title), std::move(columns)));
  return *tables_.back();
}

void Report::write_json(const std::string& path, const std::string& run) const {
  nlohmann::json out{{"format", "tapegrad_bench 1"}, {"run", nlohmann::json::parse(run)}};
  out["facts"] = nlohmann::json::object();
  for (const auto& [k, v] : facts_) out["facts"][k] = to_json(v);
  out["tables"] = nlohmann::json::object();
  for (const auto& t : tables_) out["tables"][t->id()] = nlohmann::json::parse(t->json());
  std::ofstream f(path);
  if (!f) throw std::runtime_error(fmt::format("cannot write {}", path));
  f << out.dump(2) << "\n";
}

void Report::write_markdown(const std::string& path, const std::string& command) const {
  const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm utc{};
  gmtime_r(&now, &utc);
  std::string out = fmt::format(
      "# Benchmarks\n\n"
      "Written by `{}` on {:04}-{:02}-{:02} {:02}:{:02} UTC; every figure below is from that one run, and the\n"
      "ratios compare figures measured side by side in it (the references just before the rows that use\n"
      "them). `./dev bench` writes this page again; `docs/performance-notes.md` has the measurements behind\n"
      "the design choices, this page what the code does now.\n\n| the run | |\n| --- | --- |\n",
      command, utc.tm_year + 1900, utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min);
  for (std::size_t i = 0; i < facts_.size(); ++i) {
    const Column plain{facts_[i].first, fact_labels_[i], 2, 0};
    out += fmt::format("| {} | {}{}{} |\n", fact_labels_[i], render(facts_[i].second, plain), fact_units_[i].empty() ? "" : " ", fact_units_[i]);
  }
  for (const auto& [section, about] : sections_) {
    out += fmt::format("\n## {}\n", section);
    if (!about.empty()) out += fmt::format("\n{}\n", about);
    for (const auto& t : tables_)
      if (t->section() == section) out += fmt::format("\n{}", t->markdown());
  }
  std::ofstream f(path);
  if (!f) throw std::runtime_error(fmt::format("cannot write {}", path));
  f << out;
}

double peak_mib_of(const std::function<void()>& f) {
  tapegrad::reset_peak_memory();
  const std::int64_t before = tapegrad::memory_stats().current_bytes;
  f();
  return static_cast<double>(tapegrad::memory_stats().peak_bytes - before) / (1 << 20);
}

}  // namespace bench

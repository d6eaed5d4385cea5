#include "services/router/http/metrics.h"

#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"

namespace strata {
namespace {

std::string EscapeLabel(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string EscapeHelp(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string MetricValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (value == std::floor(value) && std::fabs(value) < 1e15) {
    return absl::StrCat(static_cast<int64_t>(value));
  }
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.9g", value);
  return buffer;
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  size_t bucket = 0;
  while (bucket < bounds_.size() && value > bounds_[bucket]) ++bucket;
  std::lock_guard<std::mutex> lock(mu_);
  ++counts_[bucket];
  sum_ += value;
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.upper_bounds = bounds_;
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t running = 0;
  for (uint64_t c : counts_) {
    running += c;
    s.cumulative.push_back(running);
  }
  s.count = running;
  s.sum = sum_;
  return s;
}

void MetricsWriter::Family(const std::string& name, const std::string& help, const char* type) {
  if (family_ == name) return;
  family_ = name;
  absl::StrAppend(&out_, "# HELP ", name, " ", EscapeHelp(help), "\n# TYPE ", name, " ", type,
                  "\n");
}

void MetricsWriter::Sample(const std::string& name, const MetricLabels& labels, double value) {
  out_ += name;
  if (!labels.empty()) {
    out_ += "{";
    for (size_t i = 0; i < labels.size(); ++i) {
      absl::StrAppend(&out_, i > 0 ? "," : "", labels[i].first, "=\"",
                      EscapeLabel(labels[i].second), "\"");
    }
    out_ += "}";
  }
  absl::StrAppend(&out_, " ", MetricValue(value), "\n");
}

void MetricsWriter::Counter(const std::string& name, const std::string& help, double value,
                            const MetricLabels& labels) {
  Family(name, help, "counter");
  Sample(name, labels, value);
}

void MetricsWriter::Gauge(const std::string& name, const std::string& help, double value,
                          const MetricLabels& labels) {
  Family(name, help, "gauge");
  Sample(name, labels, value);
}

void MetricsWriter::Histogram(const std::string& name, const std::string& help,
                              const Histogram::Snapshot& s) {
  Family(name, help, "histogram");
  for (size_t i = 0; i < s.cumulative.size(); ++i) {
    const std::string le =
        i < s.upper_bounds.size() ? MetricValue(s.upper_bounds[i]) : std::string("+Inf");
    Sample(name + "_bucket", {{"le", le}}, static_cast<double>(s.cumulative[i]));
  }
  Sample(name + "_sum", {}, s.sum);
  Sample(name + "_count", {}, static_cast<double>(s.count));
}

}  // namespace strata

// Prometheus text exposition (format 0.0.4): histograms with fixed buckets, and a writer that
// emits each family's HELP and TYPE once, then its samples.
#ifndef STRATA_SERVICES_ROUTER_HTTP_METRICS_H_
#define STRATA_SERVICES_ROUTER_HTTP_METRICS_H_

#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace strata {

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

class Histogram {
 public:
  // `upper_bounds` ascending; +Inf is implied.
  explicit Histogram(std::vector<double> upper_bounds);
  void Observe(double value);

  struct Snapshot {
    std::vector<double> upper_bounds;
    std::vector<uint64_t> cumulative;  // per bound, then +Inf
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; the last is +Inf
  double sum_ = 0;
};

class MetricsWriter {
 public:
  // Samples of one family must be written one after another.
  void Counter(const std::string& name, const std::string& help, double value,
               const MetricLabels& labels = {});
  void Gauge(const std::string& name, const std::string& help, double value,
             const MetricLabels& labels = {});
  void Histogram(const std::string& name, const std::string& help,
                 const Histogram::Snapshot& snapshot);
  const std::string& text() const { return out_; }

 private:
  void Family(const std::string& name, const std::string& help, const char* type);
  void Sample(const std::string& name, const MetricLabels& labels, double value);

  std::string out_;
  std::string family_;
};

// A sample value as Prometheus reads it: integers without a fraction, +Inf, -Inf, NaN.
std::string MetricValue(double value);

}  // namespace strata

#endif  // STRATA_SERVICES_ROUTER_HTTP_METRICS_H_

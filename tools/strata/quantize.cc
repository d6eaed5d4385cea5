#include "tools/strata/quantize.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/model/checkpoint.h"
#include "common/model/mapped_file.h"
#include "common/model/safetensors.h"
#include "common/model/safetensors_writer.h"
#include "common/tensor/dtype.h"
#include "common/util/process.h"
#include "common/util/read_file.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"
#include "tools/strata/quantize_rules.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using OrderedJson = nlohmann::ordered_json;

// Files beside the weights that a loader of the quantized model still needs, copied as they are.
constexpr const char* kCopiedFiles[] = {
    "generation_config.json", "tokenizer.json",    "tokenizer_config.json",
    "tokenizer.model",        "tiktoken.model",    "special_tokens_map.json",
    "added_tokens.json",      "vocab.json",        "merges.txt",
    "chat_template.jinja",    "chat_template.json"};

absl::StatusOr<OrderedJson> ReadJsonObject(const fs::path& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path.string()));
  OrderedJson json = OrderedJson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ": not a JSON object"));
  }
  return json;
}

// One input safetensors file, mapped, and its entries in file order.
struct InputShard {
  std::string name;  // file name inside the model directory
  std::unique_ptr<MappedFile> file;
  std::vector<SafetensorsEntry> entries;
  std::vector<DType> dtypes;  // of `entries`
};

// `block_input`: the checkpoint is block-scaled FP8 (DeepSeek's layout), whose FP8 weights and
// `_scale_inv` tensors are read, not refused.
absl::StatusOr<InputShard> OpenShard(const fs::path& dir, const std::string& name,
                                     bool block_input) {
  InputShard shard;
  shard.name = name;
  ASSIGN_OR_RETURN(shard.file, MappedFile::Open((dir / name).string()));
  ASSIGN_OR_RETURN(shard.entries, ParseSafetensors(shard.file->bytes(), name));
  std::sort(shard.entries.begin(), shard.entries.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) { return a.begin < b.begin; });
  for (const SafetensorsEntry& e : shard.entries) {
    const bool block_tensor =
        block_input && (e.dtype == "F8_E4M3" || absl::EndsWith(e.name, "_scale_inv"));
    if (!block_tensor && (e.dtype == "F8_E4M3" || absl::EndsWith(e.name, "_scale") ||
                          absl::EndsWith(e.name, "_scale_inv"))) {
      if (block_input) {  // e.g. a static activation scale
        return absl::InvalidArgumentError(absl::StrCat(
            name, ": tensor '", e.name, "' is not one a block-scaled FP8 checkpoint holds (",
            "FP8 weights, their _scale_inv and 16-bit tensors are)"));
      }
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": tensor '", e.name, "' shows the model is already quantized (",
                       e.dtype, "); quantize takes a BF16, F16 or F32 checkpoint"));
    }
    absl::StatusOr<DType> dtype = ParseDType(e.dtype);
    if (!dtype.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": tensor '", e.name, "' is ", e.dtype,
          "; quantize takes a BF16, F16 or F32 checkpoint (a packed or integer-quantized one "
          "cannot be requantized)"));
    }
    shard.dtypes.push_back(*dtype);
  }
  return shard;
}

// Writes `value` as one element of `dtype` (a float type) and returns what it reads back as.
float StoreAs(DType dtype, float value, uint8_t* out) {
  if (dtype == DType::kBF16) {
    const uint16_t v = FloatToBf16(value);
    std::memcpy(out, &v, 2);
    return Bf16ToFloat(v);
  }
  if (dtype == DType::kF16) {
    const uint16_t v = FloatToF16(value);
    std::memcpy(out, &v, 2);
    return F16ToFloat(v);
  }
  std::memcpy(out, &value, 4);
  return value;
}

// The block scales of an FP8 source tensor (DeepSeek's `weight_scale_inv`): float32
// [ceil(rows / block_rows), ceil(cols / block_cols)], row-major.
struct Fp8BlockSource {
  const uint8_t* scales = nullptr;  // float32s, not necessarily aligned in the file
  int64_t block_rows = 0;
  int64_t block_cols = 0;
  int64_t grid_cols = 0;
  float ScaleOf(int64_t r, int64_t c) const {
    float s;
    std::memcpy(&s, scales + 4 * ((r / block_rows) * grid_cols + c / block_cols), 4);
    return s;
  }
};

// A checkpoint that is block-scaled FP8 already (quantization_config quant_method "fp8" with a
// weight_block_size): its FP8 weights are requantized per channel, the others copied.
struct BlockInput {
  bool present = false;
  int64_t block_rows = 0;
  int64_t block_cols = 0;
  DType model_dtype = DType::kBF16;  // of row scales and of weights dequantized to 16 bits
};

absl::StatusOr<BlockInput> ReadBlockInput(const OrderedJson& config, const fs::path& path,
                                          Fp8Scaling scaling) {
  BlockInput input;
  if (!config.contains("quantization_config")) return input;
  const OrderedJson& q = config["quantization_config"];
  const bool block =
      q.is_object() && q.contains("quant_method") && q["quant_method"].is_string() &&
      q["quant_method"].get<std::string>() == "fp8" && q.contains("weight_block_size") &&
      q["weight_block_size"].is_array() && q["weight_block_size"].size() == 2 &&
      q["weight_block_size"][0].is_number_integer() &&
      q["weight_block_size"][1].is_number_integer() &&
      q["weight_block_size"][0].get<int64_t>() > 0 && q["weight_block_size"][1].get<int64_t>() > 0;
  if (!block) {
    return absl::InvalidArgumentError(absl::StrCat(
        path.string(), ": the model is already quantized (config.json has a quantization_config",
        "; only block-scaled FP8, quant_method \"fp8\" with a weight_block_size, is requantized)"));
  }
  if (scaling == Fp8Scaling::kBlock) {
    return absl::InvalidArgumentError(
        absl::StrCat(path.string(),
                     ": the model is block-scaled FP8 already; --fp8-scaling channel "
                     "requantizes it with a scale per row"));
  }
  input.present = true;
  input.block_rows = q["weight_block_size"][0].get<int64_t>();
  input.block_cols = q["weight_block_size"][1].get<int64_t>();
  std::string dtype = "bfloat16";
  for (const char* key : {"dtype", "torch_dtype"}) {
    if (config.contains(key) && config[key].is_string()) dtype = config[key].get<std::string>();
  }
  if (dtype == "float16") {
    input.model_dtype = DType::kF16;
  } else if (dtype == "float32") {
    input.model_dtype = DType::kF32;
  }
  return input;
}

// A tensor being quantized: the source in the mapped file and its scales, per row or per
// block, both as stored (what loaders read: the checkpoint's dtype for row scales, float32 for
// block scales as DeepSeek stores them) and as the float the codes were divided by.
struct Fp8Tensor {
  const uint8_t* source = nullptr;
  DType dtype = DType::kBF16;  // of the source; for FP8 sources, of the model (row scales)
  int64_t rows = 0;
  int64_t cols = 0;
  Fp8Scaling scaling = Fp8Scaling::kChannel;
  Fp8BlockSource block_source;  // an FP8 source with its block scales
  bool dequantize = false;      // written as `dtype` values, not requantized
  std::vector<uint8_t> stored_scales;
  std::vector<float> scales;

  // Element i of the source as a float (an FP8 source: its code times its block's scale).
  float Source(int64_t i) const {
    if (block_source.scales == nullptr) return LoadAsFloat(source, dtype, i);
    return Fp8E4M3ToFloat(source[i]) * block_source.ScaleOf(i / cols, i % cols);
  }
  DType scale_dtype() const { return scaling == Fp8Scaling::kBlock ? DType::kF32 : dtype; }
  // [rows, 1], or [ceil(rows / 128), ceil(cols / 128)].
  std::vector<int64_t> scale_shape() const {
    if (scaling == Fp8Scaling::kChannel) return {rows, 1};
    return {(rows + kFp8Block - 1) / kFp8Block, (cols + kFp8Block - 1) / kFp8Block};
  }
  // Which of `scales` element (r, c) is divided by.
  int64_t ScaleIndex(int64_t r, int64_t c) const {
    if (scaling == Fp8Scaling::kChannel) return r;
    return (r / kFp8Block) * ((cols + kFp8Block - 1) / kFp8Block) + c / kFp8Block;
  }
};

void ComputeScales(Fp8Tensor& t) {
  const std::vector<int64_t> shape = t.scale_shape();
  const int64_t count = shape[0] * shape[1];
  std::vector<float> absmax(static_cast<size_t>(count), 0.0f);
  for (int64_t r = 0; r < t.rows; ++r) {
    for (int64_t c = 0; c < t.cols; ++c) {
      float& m = absmax[t.ScaleIndex(r, c)];
      m = std::max(m, std::fabs(t.Source(r * t.cols + c)));
    }
  }
  const DType dtype = t.scale_dtype();
  const size_t elem = DTypeSize(dtype);
  t.stored_scales.resize(static_cast<size_t>(count) * elem);
  t.scales.resize(static_cast<size_t>(count));
  for (int64_t k = 0; k < count; ++k) {
    float s = StoreAs(dtype, Fp8RowScale(absmax[k]), &t.stored_scales[k * elem]);
    // A row too small for a 16-bit scale (F16 underflows to 0): scale 1, codes of ~0.
    if (!(s > 0.0f) || !std::isfinite(s)) s = StoreAs(dtype, 1.0f, &t.stored_scales[k * elem]);
    t.scales[k] = s;
  }
}

// Codes of elements [begin, begin + n) of `t` (the rounded scale can put a row's largest element
// a hair above 448: FloatToFp8E4M3 saturates it).
void FillCodes(const Fp8Tensor& t, uint64_t begin, uint64_t n, uint8_t* out) {
  for (uint64_t i = begin; i < begin + n; ++i) {
    const int64_t r = static_cast<int64_t>(i) / t.cols, c = static_cast<int64_t>(i) % t.cols;
    const float inverse = 1.0f / t.scales[t.ScaleIndex(r, c)];
    out[i - begin] = FloatToFp8E4M3(t.Source(static_cast<int64_t>(i)) * inverse);
  }
}

// Bytes [begin, begin + n) of `t`'s source written as `t.dtype` values.
void FillDequantized(const Fp8Tensor& t, uint64_t begin, uint64_t n, uint8_t* out) {
  const uint64_t elem = DTypeSize(t.dtype);
  for (uint64_t b = begin; b < begin + n; b += elem) {
    StoreAs(t.dtype, t.Source(static_cast<int64_t>(b / elem)), out + (b - begin));
  }
}

// The block scales of FP8 weight `e` of a block-scaled input: `<name>_scale_inv`, float32,
// one per block.
absl::StatusOr<Fp8BlockSource> BlockScalesOf(
    const SafetensorsEntry& e, const BlockInput& input,
    const absl::flat_hash_map<std::string, std::pair<const uint8_t*, const SafetensorsEntry*>>&
        scale_invs) {
  if (e.shape.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(e.name, ": an FP8 tensor of ", e.shape.size(), " dimensions (2 expected)"));
  }
  const auto it = scale_invs.find(e.name + "_scale_inv");
  if (it == scale_invs.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(e.name, " is FP8 but the checkpoint has no ", e.name, "_scale_inv"));
  }
  const SafetensorsEntry& s = *it->second.second;
  Fp8BlockSource b{.block_rows = input.block_rows, .block_cols = input.block_cols};
  b.grid_cols = (e.shape[1] + b.block_cols - 1) / b.block_cols;
  const std::vector<int64_t> want = {(e.shape[0] + b.block_rows - 1) / b.block_rows, b.grid_cols};
  if (s.dtype != "F32" || s.shape != want) {
    return absl::InvalidArgumentError(
        absl::StrCat(s.name, ": ", s.dtype, " [", absl::StrJoin(s.shape, ", "), "], expected F32 [",
                     absl::StrJoin(want, ", "), "] (one scale per ", input.block_rows, " x ",
                     input.block_cols, " block)"));
  }
  b.scales = it->second.first + s.begin;
  return b;
}

// Runs `job(i)` for i in [0, n) on up to `threads` threads.
template <typename Job>
void ParallelFor(int n, int threads, const Job& job) {
  std::atomic<int> next{0};
  auto worker = [&] {
    for (int i = next++; i < n; i = next++) job(i);
  };
  std::vector<std::thread> pool;
  for (int i = 1; i < std::min(threads, n); ++i) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
}

std::string Gb(uint64_t bytes) { return absl::StrFormat("%.2f GB", bytes / 1e9); }

absl::Status CheckDirs(const QuantizeOptions& options, const fs::path& in, const fs::path& out) {
  std::error_code ec;
  if (options.model_dir.empty()) return absl::InvalidArgumentError("--model is required");
  if (options.out_dir.empty()) return absl::InvalidArgumentError("--out is required");
  if (!fs::is_directory(in, ec)) {
    return absl::NotFoundError(absl::StrCat(options.model_dir, ": no such model directory"));
  }
  if (fs::exists(out, ec)) {
    if (fs::equivalent(in, out, ec)) {
      return absl::InvalidArgumentError("--out must differ from --model");
    }
    if (!fs::is_directory(out, ec)) {
      return absl::InvalidArgumentError(
          absl::StrCat(options.out_dir, " exists and is not a directory"));
    }
    if (!fs::is_empty(out, ec) && !options.force) {
      return absl::InvalidArgumentError(
          absl::StrCat(options.out_dir, " exists and is not empty (--force replaces it)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<QuantizeResult> Quantize(const QuantizeOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const fs::path in(options.model_dir), out(options.out_dir);
  RETURN_IF_ERROR(CheckDirs(options, in, out));

  ASSIGN_OR_RETURN(OrderedJson config, ReadJsonObject(in / "config.json"));
  const std::string model_type = config.contains("model_type") && config["model_type"].is_string()
                                     ? config["model_type"].get<std::string>()
                                     : "";
  if (!IsQuantizableModelType(model_type)) {
    return absl::InvalidArgumentError(absl::StrCat(
        (in / "config.json").string(), ": model_type \"", model_type,
        "\" is not one quantize knows (", absl::StrJoin(QuantizableModelTypes(), ", "), ")"));
  }
  ASSIGN_OR_RETURN(const BlockInput block_input,
                   ReadBlockInput(config, in / "config.json", options.scaling));
  ASSIGN_OR_RETURN(const CheckpointFiles files, ListCheckpointFiles(options.model_dir));
  // Every header first: an unsupported tensor fails before anything is written.
  std::vector<InputShard> shards;
  for (const std::string& name : files.names) {
    ASSIGN_OR_RETURN(InputShard shard, OpenShard(in, name, block_input.present));
    shards.push_back(std::move(shard));
  }
  // A block-scaled input's scales, wherever their weights' shards are.
  absl::flat_hash_map<std::string, std::pair<const uint8_t*, const SafetensorsEntry*>> scale_invs;
  absl::flat_hash_set<std::string> fp8_weights;
  for (const InputShard& shard : shards) {
    for (const SafetensorsEntry& e : shard.entries) {
      if (!block_input.present) continue;
      if (absl::EndsWith(e.name, "_scale_inv"))
        scale_invs[e.name] = {shard.file->bytes().data(), &e};
      if (e.dtype == "F8_E4M3") fp8_weights.insert(e.name);
    }
  }
  // Scales are dropped with their weights' codes: one of another tensor would be lost.
  for (const auto& [name, scales] : scale_invs) {
    const std::string weight(absl::StripSuffix(name, "_scale_inv"));
    if (!fp8_weights.contains(weight)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": block scales of ", weight,
                       ", which is not an F8_E4M3 tensor of the checkpoint"));
    }
  }

  // Written beside the destination (same file system, so the final rename is atomic) and
  // removed unless everything succeeds.
  std::error_code ec;
  const fs::path parent = fs::absolute(out, ec).parent_path();
  fs::create_directories(parent, ec);
  const fs::path temp =
      parent / absl::StrCat(".", out.filename().string(), ".quantize-", ::getpid());
  fs::remove_all(temp, ec);
  if (!fs::create_directory(temp, ec)) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create ", temp.string(), ": ", ec.message()));
  }
  absl::Cleanup remove_temp = [&] {
    std::error_code ignored;
    fs::remove_all(temp, ignored);
  };

  const int threads = options.num_threads > 0
                          ? options.num_threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  QuantizeResult result;
  result.shards = static_cast<int>(shards.size());
  std::vector<std::string> ignore = {"lm_head"};
  OrderedJson weight_map = OrderedJson::object();
  for (InputShard& shard : shards) {
    const uint8_t* base = shard.file->bytes().data();
    // Output tensors in input order, each FP8 weight followed by its scales.
    enum class Kind { kCopy, kCodes, kScales, kDequantized };
    struct Item {
      Kind kind;
      const SafetensorsEntry* entry;
      int fp8 = -1;  // index into `fp8`
    };
    std::vector<Item> items;
    std::vector<SafetensorsTensorHeader> headers;
    std::vector<Fp8Tensor> fp8;
    for (size_t i = 0; i < shard.entries.size(); ++i) {
      const SafetensorsEntry& e = shard.entries[i];
      result.bytes_before += e.end - e.begin;
      const bool fp8_source = block_input.present && e.dtype == "F8_E4M3";
      // A block-scaled input's scales go with their weights' codes.
      if (block_input.present && absl::EndsWith(e.name, "_scale_inv")) continue;
      if (IsIgnoredLinear(e.name)) ignore.push_back(ModuleOf(e.name));
      if (!IsFp8Linear(e.name, e.shape) && !fp8_source) {
        items.push_back({Kind::kCopy, &e});
        headers.push_back({e.name, shard.dtypes[i], e.shape});
        ++result.kept_tensors;
        continue;
      }
      Fp8Tensor t;
      t.source = base + e.begin;
      t.dtype = shard.dtypes[i];
      t.rows = e.shape.size() == 2 ? e.shape[0] : 0;
      t.cols = e.shape.size() == 2 ? e.shape[1] : 0;
      t.scaling = options.scaling;
      if (fp8_source) {
        ASSIGN_OR_RETURN(t.block_source, BlockScalesOf(e, block_input, scale_invs));
        t.dtype = block_input.model_dtype;
        if (!IsFp8Linear(e.name, e.shape)) {
          // Left 16-bit per channel (kv_b_proj: attention reads it transposed), dequantized.
          if (!IsIgnoredLinear(e.name)) ignore.push_back(ModuleOf(e.name));
          t.dequantize = true;
          fp8.push_back(std::move(t));
          items.push_back({Kind::kDequantized, &e, static_cast<int>(fp8.size()) - 1});
          headers.push_back({e.name, block_input.model_dtype, e.shape});
          ++result.kept_tensors;
          continue;
        }
      }
      const bool block = t.scaling == Fp8Scaling::kBlock;
      const SafetensorsTensorHeader scale_header{e.name + (block ? "_scale_inv" : "_scale"),
                                                 t.scale_dtype(), t.scale_shape()};
      fp8.push_back(std::move(t));
      const int q = static_cast<int>(fp8.size()) - 1;
      items.push_back({Kind::kCodes, &e, q});
      headers.push_back({e.name, DType::kF8E4M3, e.shape});
      items.push_back({Kind::kScales, &e, q});
      headers.push_back(scale_header);
      ++result.quantized_tensors;
    }
    ParallelFor(static_cast<int>(fp8.size()), threads, [&](int q) {
      if (!fp8[q].dequantize) ComputeScales(fp8[q]);
    });
    const auto shard_start = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(
        WriteSafetensorsFile((temp / shard.name).string(), headers,
                             [&](size_t i, uint64_t begin, uint64_t n, uint8_t* dst) {
                               const Item& item = items[i];
                               switch (item.kind) {
                                 case Kind::kCopy:
                                   std::memcpy(dst, base + item.entry->begin + begin, n);
                                   break;
                                 case Kind::kCodes:
                                   FillCodes(fp8[item.fp8], begin, n, dst);
                                   break;
                                 case Kind::kScales:
                                   std::memcpy(dst, fp8[item.fp8].stored_scales.data() + begin, n);
                                   break;
                                 case Kind::kDequantized:
                                   FillDequantized(fp8[item.fp8], begin, n, dst);
                                   break;
                               }
                             },
                             threads));
    uint64_t shard_bytes = 0;
    for (const SafetensorsTensorHeader& h : headers) {
      shard_bytes += h.bytes();
      weight_map[h.name] = shard.name;
    }
    result.bytes_after += shard_bytes;
    if (options.progress) {
      const double sec =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - shard_start).count();
      const auto to_fp8 = std::count_if(items.begin(), items.end(),
                                        [](const Item& item) { return item.kind == Kind::kCodes; });
      StatusLine(absl::StrFormat("%s: %d tensors to FP8, %s in %.2f s", shard.name, to_fp8,
                                 Gb(shard_bytes), sec));
    }
    // Unmap: a checkpoint larger than memory stays streamed. A block-scaled input's shards stay
    // mapped: a later shard's weights may have their scales in this one.
    if (!block_input.present) shard.file.reset();
  }

  if (files.indexed) {
    OrderedJson index;
    index["metadata"] = {{"total_size", result.bytes_after}};
    index["weight_map"] = std::move(weight_map);
    RETURN_IF_ERROR(
        WriteTextFile((temp / "model.safetensors.index.json").string(), index.dump(2) + "\n"));
  }
  config["quantization_config"] = options.scaling == Fp8Scaling::kBlock
                                      ? BlockQuantizationConfigJson(std::move(ignore))
                                      : QuantizationConfigJson(std::move(ignore));
  RETURN_IF_ERROR(WriteTextFile((temp / "config.json").string(), config.dump(2) + "\n"));
  for (const char* name : kCopiedFiles) {
    if (!fs::exists(in / name, ec)) continue;
    if (!fs::copy_file(in / name, temp / name, ec)) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot copy ", (in / name).string(), ": ", ec.message()));
    }
  }

  // Replace the destination only now that the new model is complete.
  if (fs::exists(out, ec)) {
    fs::remove_all(out, ec);
    if (ec) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot replace ", options.out_dir, ": ", ec.message()));
    }
  }
  fs::rename(temp, out, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot move the result to ", options.out_dir, ": ", ec.message()));
  }
  std::move(remove_temp).Cancel();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace strata

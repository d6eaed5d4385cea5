// What may come next in a request's output, beyond what sampling decides: a grammar (a JSON
// schema, a regular expression) the text must follow (common/grammar/). The engine only masks
// and advances; it knows nothing of grammars.
#ifndef STRATA_COMMON_ENGINE_TOKEN_CONSTRAINT_H_
#define STRATA_COMMON_ENGINE_TOKEN_CONSTRAINT_H_

#include <cstdint>
#include <memory>

namespace strata {

// One request's state in its grammar.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Sets logits[i] to -inf for each token i in [0, vocab) that may not come next. Once the
  // grammar is complete, only the end-of-sequence tokens may.
  virtual void MaskLogits(float* logits, int64_t vocab) = 0;
  // Advances past `token`; false (the state unchanged) when the grammar does not allow it.
  virtual bool Accept(int32_t token) = 0;
  // Whether the output is complete: the grammar matched and took an end-of-sequence token.
  virtual bool terminated() const = 0;
};

// A compiled grammar, shared by the requests that ask for it: each gets its own state.
class CompiledConstraint {
 public:
  virtual ~CompiledConstraint() = default;
  virtual std::unique_ptr<TokenConstraint> NewConstraint() const = 0;
};

}  // namespace strata

#endif  // STRATA_COMMON_ENGINE_TOKEN_CONSTRAINT_H_

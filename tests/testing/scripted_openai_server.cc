// scripted_openai_server REPLY: the HTTP API of testing::Api (the demo model's tokenizer and
// chat format, a FakeStepRunner instead of a model) whose every reply is the text REPLY, then
// the end of sequence. Prints "LISTENING <port>" and serves until its standard input closes.
// For clients' end-to-end tests of what the server makes of a known reply (tests/python).
#include <iostream>
#include <string>

#include "tests/testing/openai_api.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: scripted_openai_server REPLY\n";
    return 2;
  }
  strata::testing::Api api(strata::testing::Named("strata-demo"));
  api.SetScript(argv[1]);
  std::cout << "LISTENING " << api.port() << std::endl;
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  return 0;
}

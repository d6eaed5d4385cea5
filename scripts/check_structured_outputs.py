#!/usr/bin/env python3
"""Checks structured outputs with Python's jsonschema: each line of the JSONL file that
structured_output_test writes (STRATA_STRUCTURED_OUTPUTS) is {"schema", "text"}; the text must
parse as JSON and the schema must validate it. Prints the count; exits 1 on any failure."""

import json
import sys

import jsonschema
from importlib.metadata import version


def main(path):
    total = valid = 0
    with open(path) as lines:
        for line in lines:
            record = json.loads(line)
            total += 1
            try:
                jsonschema.validate(json.loads(record["text"]), record["schema"])
                valid += 1
            except (json.JSONDecodeError, jsonschema.ValidationError) as e:
                print(f"invalid: {record['text']!r}: {e}", file=sys.stderr)
    print(f"{valid} of {total} outputs parse and validate (jsonschema {version('jsonschema')})")
    return 0 if total > 0 and valid == total else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

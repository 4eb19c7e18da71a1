#!/usr/bin/env python3
"""Counts test cases after `bazel test` and prints `N passed, M failed`.

Bazel reports targets; a gtest binary holds many cases and a lit target one.
This reads each reported target's test.xml (gtest's own XML, or the one Bazel
writes for a script test) and counts cases; a target that failed to build or
timed out counts as one failure.

usage: test_summary.py BAZEL_OUTPUT_LOG BAZEL_TESTLOGS_DIR
"""
import os
import re
import sys
import xml.etree.ElementTree as ET

STATUS = re.compile(r"^(//\S+)\s+(?:\(cached\)\s+)?(PASSED|FAILED TO BUILD|FAILED|FLAKY|TIMEOUT|NO STATUS|INCOMPLETE|SKIPPED)\b")


def count_cases(xml_path):
    """(passed, failed, skipped) test cases in one test.xml."""
    root = ET.parse(xml_path).getroot()
    passed = failed = skipped = 0
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif case.find("skipped") is not None or case.get("result") == "skipped" \
                or case.get("status") == "notrun":
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped


def main():
    log, testlogs = sys.argv[1], sys.argv[2]
    passed = failed = skipped = 0
    failures = []
    with open(log, errors="replace") as f:
        for line in f:
            m = STATUS.match(line.strip())
            if not m:
                continue
            target, status = m.groups()
            if status == "SKIPPED":
                continue
            package, name = target[2:].split(":")
            xml_path = os.path.join(testlogs, package, name, "test.xml")
            if status in ("PASSED", "FLAKY", "FAILED") and os.path.exists(xml_path):
                p, fl, s = count_cases(xml_path)
                if status != "PASSED" and fl == 0:
                    fl = 1  # the target failed outside any one case
                passed, failed, skipped = passed + p, failed + fl, skipped + s
            elif status == "PASSED":
                passed += 1
            else:
                failed += 1
            if status not in ("PASSED", "FLAKY"):
                failures.append(f"{target} {status}")
    for failure in failures:
        print("failed:", failure)
    if passed + failed == 0:
        print("no tests ran (did the build fail before testing?)")
        failed = 1
    line = f"{passed} passed, {failed} failed"
    if skipped:
        line += f", {skipped} skipped"
    print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

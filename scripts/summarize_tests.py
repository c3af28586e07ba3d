#!/usr/bin/env python3
"""Totals every test case of every suite in the given build dirs and prints "N passed, N failed".

Suites that write JUnit XML (GoogleTest, the CLI test) count their cases; others count as one test
from meson's log. A suite that failed without reporting a failed case (a crash) counts one failure."""
import json
import os
import sys
import xml.etree.ElementTree as ET

passed = failed = 0
for build in sys.argv[1:]:
    label = os.path.basename(build.rstrip("/"))
    log = os.path.join(build, "meson-logs", "testlog.json")
    if not os.path.exists(log):
        print(f"{label}: no test log (the build failed)")
        failed += 1
        continue
    for line in open(log):
        t = json.loads(line)
        name, ok = t["name"], t["result"] == "OK"
        xml_path = os.path.join(build, "test-results", name + ".xml")
        if os.path.exists(xml_path):
            root = ET.parse(xml_path).getroot()
            cases = root.iter("testcase")
            p = f = 0
            for c in cases:
                if c.find("failure") is not None or c.find("error") is not None:
                    f += 1
                elif c.find("skipped") is not None:  # pytest's skips pass nothing
                    continue
                elif c.get("result", "completed") in ("completed", "") and c.get("status", "run") != "notrun":
                    p += 1
            if not ok and f == 0:
                f = 1  # crashed or exited non-zero after its cases
            print(f"{label}/{name}: {p} passed, {f} failed")
            passed += p
            failed += f
        else:
            print(f"{label}/{name}: {'passed' if ok else 'FAILED (' + t['result'] + ')'}")
            passed += ok
            failed += not ok
if passed == 0:
    print("no test was executed")
    failed += 1
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)

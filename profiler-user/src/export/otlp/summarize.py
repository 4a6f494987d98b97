"""Reads an OTLP ExportProfilesServiceRequest with the OFFICIAL definitions (PyPI's
opentelemetry-proto) and prints a JSON summary for the Rust tests to compare with the store:

  {"resource": {key: value}, "scope": [name, version],
   "profiles": [{"sample_type": [type, unit], "period_type": [type, unit], "period": n,
                 "time_unix_nano": t, "duration_nano": d, "profile_id": hex}],
   "stacks": [[thread.name, [[name, kernel], ...root first], count], ...],
   "observations": [[timestamp, thread.id, process.pid, cpu.logical_number, value], ...],
   "workloads": {json of a sample's container/k8s/systemd attributes: count},
   "sample_attribute_keys": [...], "frame_types": [...], "samples": weighted count}

A Python frame (profile.frame.type = cpython) is named back `func (file:line)`, the store's
form. Exits non-zero if the message holds a field these definitions do not know (a wrong field
number or type on our side), or if a table's entry 0 is not its zero value.

Usage: python3 summarize.py REQUEST_FILE [--gzip]
"""

import gzip
import json
import sys

from google.protobuf import unknown_fields
from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2


def unknown(msg, path, out):
    if len(unknown_fields.UnknownFieldSet(msg)):
        out.append(path)
    for field, value in msg.ListFields():
        if field.message_type is None:
            continue
        if field.is_repeated:
            for i, v in enumerate(value):
                unknown(v, f"{path}.{field.name}[{i}]", out)
        else:
            unknown(value, f"{path}.{field.name}", out)


def any_value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def main():
    data = open(sys.argv[1], "rb").read()
    if "--gzip" in sys.argv[2:]:
        data = gzip.decompress(data)
    req = profiles_service_pb2.ExportProfilesServiceRequest.FromString(data)
    bad = []
    unknown(req, "request", bad)
    if bad:
        sys.exit(f"fields unknown to opentelemetry-proto in {len(bad)} messages, such as {bad[:3]}")
    d = req.dictionary
    s = d.string_table
    for table in ("mapping_table", "location_table", "function_table", "attribute_table", "stack_table"):
        entries = getattr(d, table)
        if not entries or entries[0].ByteSize() != 0:
            sys.exit(f"{table}[0] is not the zero value")
    if not s or s[0] != "":
        sys.exit('string_table[0] is not ""')

    def attrs(indices):
        out = {}
        for i in indices:
            a = d.attribute_table[i]
            key = s[a.key_strindex]
            if key in out:
                sys.exit(f"attribute {key} twice in one attribute_indices")
            out[key] = any_value(a.value)
        return out

    frame_types = set()

    def frame(loc_index):
        loc = d.location_table[loc_index]
        kind = attrs(loc.attribute_indices).get("profile.frame.type")
        frame_types.add(kind)
        line = loc.lines[0]
        f = d.function_table[line.function_index]
        name = s[f.name_strindex]
        if kind == "cpython":
            name = f"{name} ({s[f.filename_strindex]}:{line.line})"
        return [name, kind == "kernel"]

    summary = {"resource": {}, "profiles": [], "stacks": [], "observations": [], "samples": 0,
               "workloads": {}}
    keys = set()
    for rp in req.resource_profiles:
        summary["resource"] = {kv.key: any_value(kv.value) for kv in rp.resource.attributes}
        for sp in rp.scope_profiles:
            summary["scope"] = [sp.scope.name, sp.scope.version]
            for p in sp.profiles:
                summary["profiles"].append({
                    "sample_type": [s[p.sample_type.type_strindex], s[p.sample_type.unit_strindex]],
                    "period_type": [s[p.period_type.type_strindex], s[p.period_type.unit_strindex]],
                    "period": p.period,
                    "time_unix_nano": p.time_unix_nano,
                    "duration_nano": p.duration_nano,
                    "profile_id": p.profile_id.hex(),
                })
                for sample in p.samples:
                    a = attrs(sample.attribute_indices)
                    keys.update(a)
                    if len(sample.values) != len(sample.timestamps_unix_nano):
                        sys.exit("a sample's values and timestamps differ in length")
                    loc = d.stack_table[sample.stack_index].location_indices
                    frames = [frame(i) for i in reversed(loc)]
                    total = sum(sample.values)
                    summary["stacks"].append([a.get("thread.name"), frames, total])
                    summary["samples"] += total
                    workload = {k: v for k, v in a.items() if k.split(".")[0] in ("container", "k8s", "systemd")}
                    w = json.dumps(workload, sort_keys=True)
                    summary["workloads"][w] = summary["workloads"].get(w, 0) + total
                    for t, v in zip(sample.timestamps_unix_nano, sample.values):
                        summary["observations"].append(
                            [t, a.get("thread.id"), a.get("process.pid"), a.get("cpu.logical_number"), v])
    summary["sample_attribute_keys"] = sorted(keys)
    summary["frame_types"] = sorted(frame_types)
    json.dump(summary, sys.stdout)


main()

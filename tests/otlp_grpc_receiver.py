"""An OTLP/gRPC profiles receiver built from the reference pieces: grpcio's server and the
ProfilesService stubs of PyPI's opentelemetry-proto. It answers the first REFUSE calls
UNAVAILABLE, then takes every request and appends one JSON line per request to OUT:

  {"time_unix_nano": t, "duration_nano": d, "samples": weighted count, "observations": n}

It also serves LogsService (findings as log records): one JSON line per record to OUT.logs,

  {"event_name": e, "time_unix_nano": t, "severity_number": n, "attributes": {key: value}}

Usage: python3 otlp_grpc_receiver.py PORT_FILE OUT REFUSE
(the port it listens on, on 127.0.0.1, is written to PORT_FILE once it is ready).
"""

import json
import os
import sys
import threading
from concurrent import futures

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.profiles.v1development import (
    profiles_service_pb2,
    profiles_service_pb2_grpc,
)

port_file, out_path, refuse = sys.argv[1], sys.argv[2], int(sys.argv[3])
lock = threading.Lock()
calls = 0


class Receiver(profiles_service_pb2_grpc.ProfilesServiceServicer):
    def Export(self, request, context):
        global calls
        with lock:
            calls += 1
            if calls <= refuse:
                context.abort(grpc.StatusCode.UNAVAILABLE, "warming up")
            start, end, samples, observations = None, 0, 0, 0
            for rp in request.resource_profiles:
                for sp in rp.scope_profiles:
                    for p in sp.profiles:
                        start = p.time_unix_nano if start is None else min(start, p.time_unix_nano)
                        end = max(end, p.time_unix_nano + p.duration_nano)
                        for s in p.samples:
                            samples += sum(s.values)
                            observations += len(s.timestamps_unix_nano)
            with open(out_path, "a") as out:
                line = {"time_unix_nano": start, "duration_nano": end - start, "samples": samples,
                        "observations": observations}
                out.write(json.dumps(line) + "\n")
        return profiles_service_pb2.ExportProfilesServiceResponse()


class Logs(logs_service_pb2_grpc.LogsServiceServicer):
    def Export(self, request, context):
        with lock, open(out_path + ".logs", "a") as out:
            for rl in request.resource_logs:
                for sl in rl.scope_logs:
                    for r in sl.log_records:
                        attrs = {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in r.attributes}
                        line = {"event_name": r.event_name, "time_unix_nano": r.time_unix_nano,
                                "severity_number": r.severity_number, "attributes": attrs}
                        out.write(json.dumps(line) + "\n")
        return logs_service_pb2.ExportLogsServiceResponse()


server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
profiles_service_pb2_grpc.add_ProfilesServiceServicer_to_server(Receiver(), server)
logs_service_pb2_grpc.add_LogsServiceServicer_to_server(Logs(), server)
port = server.add_insecure_port("127.0.0.1:0")
server.start()
with open(port_file + ".tmp", "w") as f:
    f.write(str(port))
os.rename(port_file + ".tmp", port_file)
server.wait_for_termination()

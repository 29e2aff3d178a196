"""What the artifact tests share: a real PNG made here, and a job that keeps artifacts through
``run.log_artifact`` and MLflow's ``log_artifact``."""

from __future__ import annotations

import zlib


def png(width: int = 2, height: int = 2) -> bytes:
    """A real PNG of grey pixels (what a browser decodes and shows)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return len(data).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")

    rows = b"".join(b"\x00" + b"\x80" * width for _ in range(height))
    header = width.to_bytes(4, "big") + height.to_bytes(4, "big") + b"\x08\x00\x00\x00\x00"
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


#: a job that writes a note, a directory with a PNG and a CSV, and keeps them as artifacts: the
#: note and the directory (under figs/) through the SDK, the note again through MLflow in the
#: experiment "vision" (its project then). It prints what log_artifact answered.
ARTIFACT_JOB = """
import base64, os
import mlflow
import trainhouse

run = trainhouse.init()
with open("notes.txt", "w") as f:
    f.write("hello from the job\\n")
os.makedirs("plots", exist_ok=True)
with open("plots/curve.png", "wb") as f:
    f.write(base64.b64decode({png!r}))
with open("plots/table.csv", "w") as f:
    f.write("step,loss\\n0,1.0\\n1,0.5\\n")
print("kept", run.log_artifact("notes.txt"), flush=True)
print("kept", run.log_artifact("plots", artifact_path="figs"), flush=True)
mlflow.set_experiment("vision")
with mlflow.start_run():
    mlflow.log_artifact("notes.txt", artifact_path="mlflow")
run.finish()
"""


def artifact_job() -> str:
    import base64

    return ARTIFACT_JOB.replace("{png!r}", repr(base64.b64encode(png(8, 6)).decode()))

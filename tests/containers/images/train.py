"""A training image's program, as a team would write one for SageMaker: ``train`` reads
/opt/ml/input (config files and channels), resumes from /opt/ml/checkpoints, writes
/opt/ml/model and /opt/ml/output/data, or /opt/ml/output/failure when told to fail."""

import json
import os
import sys
import time

ML = "/opt/ml"


def read(path):
    with open(os.path.join(ML, path)) as f:
        return json.load(f)


def hostile(target, exit_code):
    """Point links at ``target``, a file of the host (not of this container), where the
    runner reads and uploads: a checkpoint, the failure file, the model folder."""
    checkpoints = os.path.join(ML, "checkpoints")
    if exit_code == 0:  # a link among the checkpoints
        os.symlink(target, os.path.join(checkpoints, "leak"))
    else:  # the checkpoint folder itself a link
        os.rmdir(checkpoints)
        os.symlink(os.path.dirname(target), checkpoints)
    os.symlink(target, os.path.join(ML, "output", "failure"))
    os.rmdir(os.path.join(ML, "model"))
    os.symlink(os.path.dirname(target), os.path.join(ML, "model"))
    print("links made", flush=True)
    sys.exit(exit_code)


def main():
    hyperparameters = read("input/config/hyperparameters.json")
    resources = read("input/config/resourceconfig.json")
    channels = read("input/config/inputdataconfig.json")
    print("training with", json.dumps(hyperparameters), flush=True)
    if hyperparameters.get("hostile"):
        hostile(hyperparameters["hostile"], exit_code=int(hyperparameters.get("exit", "1")))
    if hyperparameters.get("fail"):
        with open(os.path.join(ML, "output/failure"), "w") as f:
            f.write(f"bad data: {hyperparameters['fail']}")
        sys.exit(1)
    seen = {}
    for channel in sorted(channels):
        folder = os.path.join(ML, "input/data", channel)
        numbers = []
        for name in sorted(os.listdir(folder)):
            with open(os.path.join(folder, name)) as f:
                numbers += [float(x) for x in f.read().split()]
        seen[channel] = sum(numbers)
    step_file = os.path.join(hyperparameters.get("checkpoint_dir", ML + "/checkpoints"), "step")
    resumed = 0
    if os.path.exists(step_file):
        with open(step_file) as f:
            resumed = int(f.read())
    steps = int(hyperparameters.get("steps", "1"))
    for step in range(resumed + 1, steps + 1):
        time.sleep(float(hyperparameters.get("step_s", "0")))
        with open(step_file + ".tmp", "w") as f:
            f.write(str(step))
        os.replace(step_file + ".tmp", step_file)
        print("step", step, flush=True)
    model = {
        "argv": sys.argv[1:],
        "hyperparameters": hyperparameters,
        "sums": seen,
        "host": resources["current_host"],
        "resumed_from": resumed,
        "job": os.environ.get("TRAINING_JOB_NAME"),
        "greeting": os.environ.get("GREETING"),
        "code": sorted(os.listdir(os.path.join(ML, "code"))),
        "interfaces": sorted(os.listdir("/sys/class/net")),
    }
    with open(os.path.join(ML, "model/model.json"), "w") as f:
        json.dump(model, f)
    with open(os.path.join(ML, "output/data/report.txt"), "w") as f:
        f.write("done\n")
    print("training done", flush=True)


if __name__ == "__main__":
    main()

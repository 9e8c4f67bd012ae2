"""The training job behind train.py: config, model, data, checkpoints, distributed set-up, loop."""

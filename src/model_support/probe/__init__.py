"""One model -> one record: stages, downloads, devices, sharded runs, repro scripts, signatures."""

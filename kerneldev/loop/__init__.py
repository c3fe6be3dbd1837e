"""The loop: pull, drift, push, roll back, the import check, groups' release."""

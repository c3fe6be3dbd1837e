"""A sandbox host on this machine: sshd, tree, decode service, demo."""

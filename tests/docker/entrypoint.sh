# Run the host's sim-server (its Python and the autotune it has installed) inside the container.
exec /bin/busybox chroot /host "$AUTOTUNE_PYTHON" -m autotune.cli sim-server "$@"

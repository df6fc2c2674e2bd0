# Installation is filled in by the packaging step (see docs/); placeholder kept minimal.

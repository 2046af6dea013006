"""The programs the training image runs (`e2e.node.train_image` copies this folder's modules into
it): a rank of an MPI or a DDP job, and the MPI launcher's start."""

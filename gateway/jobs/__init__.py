"""The Files and Batch APIs: their calls, the batch runner, and their stores."""

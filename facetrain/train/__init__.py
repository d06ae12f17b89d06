"""Training (layer 3): each rank's entry point (`rank`, under torch elastic's `@record`), a run's setup,
its loop (`trainer`), the step, what it resumes from, its run directory, its optimizer, schedule, weight
average and trackers. It builds on parallel/, checkpoint/ and
interop/ (`model.init` loads through `interop.load_model`)."""

"""What one decode step passes between its parts, below the engine, the drafters and the controllers: a request's
`Sequence`, a drafter's `Proposal`, the `StepStats` a controller observes, and the runner that feeds ragged rows to
a model. The engine imports drafters and controllers; they import this, never the engine."""

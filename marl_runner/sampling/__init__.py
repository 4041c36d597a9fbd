"""The sampling loop and its data: runner, round, rewards, episodes, trajectories, fragments."""

-- The identity of the Redis server that holds the pool's keys (KEYS[1] only
-- routes the call on Redis Cluster): its run id, which changes when that
-- server restarts or another one takes over (the moments Redis may lose
-- writes). The scripts that admit, route or record starts compare it with
-- the one the caller read last (`went_back` in base.lua).
-- Returns the run id ('' when INFO shows none)
return string.match(redis.call('INFO', 'server'), 'run_id:(%w+)') or ''

-- The identity of the Redis server that holds the pool's keys (KEYS[1] only
-- routes the call on Redis Cluster): its run id, which changes when that
-- server restarts or another one takes over (the moments Redis may lose
-- writes), and its LASTSAVE, which the scripts compare cheaply on every call
-- (`went_back` in base.lua: a LASTSAVE the caller has not seen makes them
-- read the run id).
-- Returns {run id, lastsave}
return {
  string.match(redis.call('INFO', 'server'), 'run_id:(%w+)') or '',
  redis.call('LASTSAVE'),
}

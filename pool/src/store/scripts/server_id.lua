-- The run id of the Redis server that holds the pool's keys (KEYS[1] only
-- routes the call on Redis Cluster). It changes when that server restarts
-- or another one takes over: the moments Redis may lose writes.
return string.match(redis.call('INFO', 'server'), 'run_id:(%w+)') or ''

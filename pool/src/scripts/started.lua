-- Finishes a start entry: removes it from the worker's inbox and answers
-- the dispatcher. After a handler started a claimed job (status 'ok'), or
-- when a worker drops an entry whose key already runs (status 'ok' for its
-- own run, 'superseded' for a newer one elsewhere).
-- KEYS: base, 9 worker inbox, 10 reply stream (any pool key when no reply)
-- ARGV: base, 4 job key, 5 token, 6 worker id, 7 inbox entry id,
--       8 reply request id (0: none), 9 status to answer
-- Returns 'ok' when the key is owned by this worker with this token, else
-- 'lost' (the claim is gone: the caller stops its run). The entry is removed
-- and the answer sent either way.
local owned = mget(JOBS, ARGV[4]) == ARGV[6] .. ' ' .. ARGV[5]
stream_remove(KEYS[9], ARGV[7])
if ARGV[8] ~= '0' then
  stream_add(KEYS[10], 'reply', ARGV[8] .. ' ' .. ARGV[9], 1000)
end
if owned then return 'ok' end
return 'lost'

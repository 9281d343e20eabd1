-- A handler refused to start a job: drop the claim (or, on the fast path,
-- the pending guard) and the payload (the job is over), remove the entry
-- and answer.
-- KEYS: base, 9 worker inbox, 10 reply stream
-- ARGV: base, 4 job key, 5 token, 6 worker id, 7 inbox entry id,
--       8 reply request (0: none), 9 error text
-- Returns 'ok'
local key, token = ARGV[4], ARGV[5]
-- The dispatch is over (`end_stored_dispatch`).
if mget(JOBS, key) == ARGV[6] .. ' ' .. token then
  mdel(JOBS, key)
  end_stored_dispatch(key)
else
  local p = mget(PENDING, key)
  if p and string.sub(p, 1, #token + 1) == token .. ' ' then
    mdel(PENDING, key)
    end_stored_dispatch(key)
  end
end
stream_remove(KEYS[9], ARGV[7])
if ARGV[8] ~= '0' then
  stream_add(KEYS[10], 'reply', ARGV[8] .. ' failed ' .. ARGV[9], 1000)
end
return 'ok'

import { z } from "zod";

/** Lower-case letters, digits and dashes: a site's name goes into endpoint ids, KV keys and metric labels. */
export const siteNameSchema = z
  .string()
  .regex(
    /^[a-z0-9][a-z0-9-]{0,31}$/,
    "a site name: 1-32 lower-case letters, digits or dashes, not starting with a dash",
  );

// The built-in dataset's text: short pieces of English prose written for the ferry project (no
// third-party text; the project's license covers it). Documents are separated by blank lines.
#include "engine/train/builtin_text.h"

namespace ferry {

std::string_view BuiltinText() {
  return R"TEXT(The ferry leaves the north pier at seven in the morning, when the water is still grey and the gulls have not yet decided what kind of day it will be. Passengers stand at the rail with paper cups of coffee, watching the town shrink behind them. Nobody says much. The engine hums under their feet, steady as a heartbeat, and the wake spreads out behind the boat in a long white fan.

A river does not hurry, and it does not wait. It carries leaves and logs and the reflections of clouds, and it carves its bed a little deeper every year. The people who live beside it learn its moods: the brown rush of spring, the slow green calm of August, the thin ice that creeps out from the banks in December. They build their houses on stilts and their boats with flat bottoms, and they do not argue with the water.

The old lighthouse keeper kept a notebook in which he wrote down the weather every hour. Wind from the west, force four. Light rain. Visibility two miles. Three fishing boats returned before dark. When he retired, he gave the notebooks to the library, forty years of them, and a student spent a whole summer reading them. She found that the winters had grown milder and the storms more sudden, and that the keeper had once seen a whale in the harbour and written only one word beside the date: wonderful.

To bake bread, mix flour, water, salt and a little yeast. Knead the dough until it is smooth and springs back when pressed. Let it rise in a warm place until it has doubled in size, then shape it into a loaf and let it rise again. Bake it in a hot oven until the crust is brown and the bottom sounds hollow when tapped. Let it cool before cutting, if you can wait that long.

Counting is older than writing. Shepherds cut notches in sticks, one for each sheep, and merchants pressed tokens into clay. Zero came late, and with it the idea that nothing could be a number. Today a computer counts by switching tiny currents on and off, billions of times each second, and yet the principle is the same as the shepherd's stick: one mark for one thing, and the marks added up.

The market opens on Saturday at dawn. Farmers unload crates of apples, potatoes and onions; a woman sells honey in jars of three sizes; a boy with a bicycle sells newspapers and whistles the same tune over and over. By nine o'clock the square is crowded, and by noon the best tomatoes are gone. In the afternoon the stalls come down, the street sweepers arrive, and the pigeons take back the square.

Small steps, repeated often, move mountains. A student who reads ten pages a day reads a long novel every month. A runner who adds one minute each week runs for an hour by the end of the year. The trick is not to be brave once but to be patient many times, and to forgive yourself on the days when the step is smaller than you hoped.

In the library, the clocks were all slightly wrong. The one above the door ran fast, the one in the reading room ran slow, and the one in the basement had stopped at twenty past four years ago. Regular readers learned to average them. The librarian said she preferred it that way, because a room full of correct clocks makes people anxious, and a library should be a place where time is allowed to wander.

Weights and gradients, like freight, must be moved before they can be used. A careful planner writes down what each trip will carry, how long it will take, and where everything will wait in between. Then the boats run on schedule, nothing is left on the dock, and the cargo arrives in the order it is needed.

The cat had no name, because no one could agree on one. The children called her Captain, the grandmother called her Dust, and the postman, who fed her biscuits through the letterbox, called her Madam. She answered to none of them and came when she pleased, which was usually at dinner time, and she slept on whichever bed was warmest.

When the snow came, the village went quiet. Cars stayed in their garages, the school closed, and the only sound in the morning was the scrape of shovels. Children built a fort by the church and defended it all afternoon against their older brothers. At dusk the windows glowed yellow, smoke rose straight up from the chimneys, and the whole valley seemed to hold its breath.

A good question is worth more than a quick answer. Why does the kettle sing before it boils? Why is the sky blue at noon and red at evening? Why do we remember songs better than lists? Each question opens a door, and behind each door there is a corridor with more doors, and a curious mind can walk those corridors for a lifetime without ever reaching the end.

She tuned the old piano by ear, one string at a time, listening for the slow beating that tells two notes are almost but not quite the same. When the beating stopped, the note was true. It took her all afternoon. Then she played a simple melody, and the room, which had been silent for years, remembered how to sing.

The map showed a road that no longer existed. It curved around a hill, crossed a stream on a stone bridge, and ended at a farm marked with a tiny square. The walkers followed it anyway, through bracken and over fallen walls, and found the bridge still standing, mossy and solid, with the date carved into its keystone. Of the farm there was nothing left but a row of apple trees, still bearing fruit.
)TEXT";
}

}  // namespace ferry
